"""SFT's masks, loss, gradients and token accuracy equal TRL's SFTTrainer (`assistant_only_loss=True`)
on the same batch: the tiny model, the same conversations and chat template (ChatML, with TRL's
`{% generation %}` blocks so TRL can mask; they render the same text as the plain template)."""

import pytest
import torch

from training.models import load_model
from training.sft import Example, collate, encode, sft_loss, token_nll

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

CHATML_GENERATION = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONVERSATIONS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "user", "content": "Add 3 and 5"}, {"role": "assistant", "content": "calc(3+5)"}, {"role": "tool", "content": "8"},
     {"role": "assistant", "content": "It is 8."}],
    [{"role": "user", "content": "Say hi twice"}, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"},
     {"role": "assistant", "content": "hi hi"}],
]


def _model():
    model, tok = load_model("tiny-random:llama", device=torch.device("cpu"))
    tok.chat_template = CHATML_GENERATION
    return model, tok


@pytest.fixture(scope="module")
def trl_side(tmp_path_factory):
    """TRL's tokenized batch, loss, gradients and token accuracy."""
    model, tok = _model()
    args = trl.SFTConfig(output_dir=str(tmp_path_factory.mktemp("trl")), assistant_only_loss=True, per_device_train_batch_size=3,
                         report_to=[], use_cpu=True, max_length=None)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list([{"messages": c} for c in CONVERSATIONS]),
                             processing_class=tok)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(CONVERSATIONS))])
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, dict(batch))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    accuracy = trainer._metrics["train"]["mean_token_accuracy"][-1]
    return batch, float(loss.detach()), grads, accuracy


def test_it_masks_the_same_tokens_as_trl(trl_side):
    batch, *_ = trl_side
    _, tok = _model()
    for i, conv in enumerate(CONVERSATIONS):
        ids, mask = encode(tok, conv)
        n = int(batch["attention_mask"][i].sum())
        assert ids == batch["input_ids"][i, :n].tolist()
        assert mask == (batch["labels"][i, :n] != -100).int().tolist()


def test_its_loss_gradients_and_token_accuracy_equal_trls(trl_side):
    _, trl_loss, trl_grads, trl_accuracy = trl_side
    model, tok = _model()
    model.train()
    examples = [Example("a", *map(tuple, encode(tok, conv))) for conv in CONVERSATIONS]
    n_tokens = sum(sum(e.loss_mask[1:]) for e in examples)
    loss, hits = 0.0, 0.0
    for e in examples:  # one micro-batch per conversation: the accumulated step equals the whole batch's
        nll, hit, counted = token_nll(model, collate([e], tok.pad_token_id))
        part = sft_loss(nll, counted, n_tokens)
        part.backward()
        loss += float(part)
        hits += float((hit & counted).sum())

    assert loss == pytest.approx(trl_loss, rel=1e-5)
    assert hits / n_tokens == pytest.approx(trl_accuracy, rel=1e-6)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == trl_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, trl_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_prompt_completion_lines_mask_the_same_tokens_as_trls_completion_only_loss(tmp_path):
    """A run's own episodes (prompt-completion lines): TRL's `completion_only_loss` on the standard
    prompt-completion format, with the template's end of turn as its EOS, learns the same tokens."""
    from training.sft import encode_completion

    model, tok = _model()
    prompt = "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"
    rows = [{"prompt": prompt, "completion": "#### 42"}, {"prompt": prompt.replace("6*7", "2+2"), "completion": "It is 4."}]
    args = trl.SFTConfig(output_dir=str(tmp_path), completion_only_loss=True, per_device_train_batch_size=2, report_to=[],
                         use_cpu=True, max_length=None, eos_token="<|im_end|>")
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows), processing_class=tok)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(rows))])
    for i, row in enumerate(rows):
        ids, mask = encode_completion(tok, row["prompt"], [{"role": "assistant", "content": row["completion"]}])
        n = int(batch["attention_mask"][i].sum())
        assert ids == batch["input_ids"][i, :n].tolist()
        assert mask == (batch["labels"][i, :n] != -100).int().tolist()
