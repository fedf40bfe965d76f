"""The decode loop's reserved KV cache and one-draw sampler change no number: greedy tokens are the
trainer's model's own, and sampled rows (leaving the batch at different steps) match transformers'
DynamicCache draw for draw."""

import re

import pytest
import torch

from training.generation import SAMPLE_BLOCK, _multinomial_sample, _sample, generate, reserved_cache
from training.models import load_model


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_model("tiny-random:llama")


def _prompts(tok):
    return [tok(text, add_special_tokens=False)["input_ids"] for text in ("hello there", "a much longer prompt than the first one", "x")]


def test_greedy_tokens_are_the_trainers_argmax_at_every_position(tiny):
    model, tok = tiny
    prompts = _prompts(tok)
    out = generate(model, tok, prompts, n=2, max_new_tokens=12, temperature=0.0)
    with torch.inference_mode():
        for prompt, group in zip(prompts, out):
            ids = group[0].token_ids
            assert group[0].token_ids == group[1].token_ids
            logits = model(input_ids=torch.tensor([prompt + list(ids)])).logits[0, len(prompt) - 1: -1]  # (T, V)
            chosen = logits.gather(1, torch.tensor(ids)[:, None]).squeeze(1)
            assert torch.allclose(chosen, logits.max(-1).values, atol=1e-5), "a greedy token is not the trainer's argmax"


def test_reserved_and_dynamic_caches_sample_the_same_rows_as_rows_leave_the_batch(tiny):
    model, tok = tiny
    prompts = _prompts(tok)
    stop = re.compile(r"\S{3}")  # ends rows at different steps: the batch shrinks while decoding
    runs = {
        kv: generate(model, tok, prompts, n=3, max_new_tokens=16, temperature=1.0, generator=torch.Generator().manual_seed(3),
                     stop=stop, stop_check_every=2, logprobs=True, kv_cache=kv)
        for kv in ("reserved", "dynamic")
    }
    a, b = ([g for group in runs[kv] for g in group] for kv in ("reserved", "dynamic"))
    assert len({len(g.token_ids) for g in a}) > 1, "every row ended at the same step: the test would not shrink the batch"
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.truncated for g in a] == [g.truncated for g in b]
    for x, y in zip(a, b):
        assert x.logprobs is not None and y.logprobs is not None
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)


def test_the_reserved_cache_grows_past_its_room(tiny):
    model, _ = tiny
    ids = torch.arange(3, 12)[None]  # (1, 9)
    cache = reserved_cache(model, capacity=4)
    assert cache is not None
    with torch.inference_mode():
        model(input_ids=ids[:, :6], past_key_values=cache, use_cache=True)
        grown = model(input_ids=ids[:, 6:], past_key_values=cache, use_cache=True).logits
        whole = model(input_ids=ids).logits[:, 6:]
    assert cache.get_seq_length() == 9
    assert torch.allclose(grown, whole, atol=1e-5)


def test_an_unknown_cache_is_refused(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="unknown kv_cache 'static'"):
        generate(model, tok, [[1, 2]], n=1, max_new_tokens=2, temperature=0.0, kv_cache="static")


@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_the_one_draw_sampler_draws_the_nucleus_distribution(top_p):
    probs = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])
    logits = probs.log().expand(40000, -1)  # (R, V)
    expected = probs.clone()
    if top_p < 1.0:
        expected[2:] = 0.0  # the mass before the third token (0.75) is past 0.7: the nucleus is the first two
        expected /= expected.sum()
    for sample in (_sample, _multinomial_sample):  # the multinomial peer is the reference
        drawn = sample(logits, 1.0, top_p, torch.Generator().manual_seed(0))
        freq = torch.bincount(drawn, minlength=5).double() / len(drawn)
        assert int(drawn[expected[drawn] == 0].numel()) == 0, f"{sample.__name__} drew a token outside the nucleus"
        assert torch.allclose(freq, expected.double(), atol=0.01), f"{sample.__name__}: {freq.tolist()}"


def _one_level(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The inversion through the whole vocabulary's float64 cumulative sum, with the same draw per row."""
    cdf = torch.softmax(logits, dim=-1).double().cumsum(-1)  # (R, V)
    u = torch.rand((cdf.shape[0], 1), generator=generator, dtype=torch.float64) * cdf[:, -1:]  # (R, 1)
    return torch.searchsorted(cdf, u, right=True).squeeze(1)  # (R,)


def test_the_two_level_inversion_picks_the_token_the_whole_vocabulary_inversion_picks():
    logits = torch.randn(64, 3 * SAMPLE_BLOCK + 77, generator=torch.Generator().manual_seed(1)) * 3  # (R, V): a ragged last block
    two = _sample(logits, 1.0, 1.0, torch.Generator().manual_seed(5))
    one = _one_level(logits, torch.Generator().manual_seed(5))
    assert torch.equal(two, one)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_the_sampler_never_draws_a_token_of_probability_zero_across_blocks(top_p):
    vocab = 4 * SAMPLE_BLOCK + 3
    live = torch.tensor([0, SAMPLE_BLOCK - 1, SAMPLE_BLOCK, 3 * SAMPLE_BLOCK + 5, vocab - 1])  # block edges, the ragged tail
    weights = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1])
    logits = torch.full((20000, vocab), float("-inf"))  # (R, V)
    logits[:, live] = weights.log()
    drawn = _sample(logits, 1.0, top_p, torch.Generator().manual_seed(0))
    expected = weights.clone()
    if top_p < 1.0:
        expected[4] = 0.0  # the mass before the fifth token is 0.9, past 0.8: the nucleus is the first four
        expected /= expected.sum()
    index = {int(t): i for i, t in enumerate(live)}
    assert set(drawn.tolist()) <= {int(t) for t, w in zip(live, expected) if w > 0}
    freq = torch.bincount(torch.tensor([index[int(t)] for t in drawn]), minlength=5).double() / len(drawn)
    assert torch.allclose(freq, expected.double(), atol=0.015), freq.tolist()
