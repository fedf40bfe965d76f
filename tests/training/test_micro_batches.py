"""How the update splits its samples into micro-batches."""

from training.update import Sample, _micro_batches


def _group(prompt_len: int, completion_lens: list[int], *, start: int, temperature: float = 1.0) -> list[Sample]:
    prompt = tuple(range(start, start + prompt_len))
    return [Sample("a", prompt, tuple([7] * n), advantage=0.5, temperature=temperature) for n in completion_lens]


def test_a_groups_candidates_share_a_micro_batch_whatever_their_lengths():
    # two groups of 4 whose completion lengths interleave: sorting by length alone would mix them
    a = _group(20, [3, 30, 5, 28], start=0)
    b = _group(21, [4, 29, 6, 27], start=100)
    micro = _micro_batches(b + a, size=4, budget=10_000)
    assert len(micro) == 2
    assert {tuple(m[0].prompt_ids) for m in micro} == {a[0].prompt_ids, b[0].prompt_ids}
    assert all(len({s.prompt_ids for s in m}) == 1 for m in micro)


def test_micro_batches_respect_rows_tokens_and_temperature():
    samples = _group(50, [10] * 4, start=0) + _group(50, [10] * 4, start=200) + _group(50, [10] * 4, start=400, temperature=0.7)
    micro = _micro_batches(samples, size=8, budget=8 * 60)
    assert sorted(len(m) for m in micro) == [4, 8]
    assert all(len({s.temperature for s in m}) == 1 for m in micro)
    # a budget of 3 padded rows: no batch goes over it, and every sample is kept once
    micro = _micro_batches(samples, size=8, budget=3 * 60)
    assert max(len(m) for m in micro) == 3
    assert sorted(id(s) for m in micro for s in m) == sorted(id(s) for s in samples)


def test_a_sample_longer_than_the_budget_still_gets_its_own_micro_batch():
    micro = _micro_batches(_group(500, [100, 100], start=0), size=8, budget=100)
    assert [len(m) for m in micro] == [1, 1]
