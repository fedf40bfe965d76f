"""Starting a run from another run's weights (`model.init_from`): each policy holds the source
checkpoint's weights after init, mapped per agent; the wrong kind of folder is refused by name."""

import re

import pytest
import torch

from training.checkpoints import save_checkpoint
from training.config import ConfigError
from training.events import NullSink
from training.policies import build_policies
from training.warmstart import checkpoint_folder, init_from


def _trained_run(config, out, step=3):
    """A run folder whose checkpoint at `step` holds weights moved off their init."""
    policies = build_policies(config, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for policy in policies.policies.values():
            for p in policy.params:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    save_checkpoint(out, step, policies, torch.Generator(), config, NullSink())
    return policies


def _state(policy):
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if policy.adapter is None or f".{policy.adapter}." in n}


@pytest.mark.parametrize("specialization", ["lora", "prompt", "full"])
def test_after_init_each_policy_holds_the_source_checkpoint_s_weights(make_config, tmp_path, specialization):
    config = make_config(specialization)
    source = _trained_run(config, tmp_path / "src")
    fresh = build_policies(config.replace(**{"model.init_from.run": str(tmp_path / "src")}), device=torch.device("cpu"))
    before = {name: _state(p) for name, p in fresh.policies.items()}

    warm = init_from(config.replace(**{"model.init_from.run": str(tmp_path / "src")}), fresh)

    assert warm is not None and warm.step == 3 and warm.checkpoint == tmp_path / "src" / "checkpoints" / "step-000003"
    for name, policy in fresh.policies.items():
        after, want = _state(policy), _state(source.policies[name])
        assert after.keys() == want.keys()
        for key in after:
            torch.testing.assert_close(after[key], want[key], rtol=0, atol=0)
        assert any(not torch.equal(after[k], before[name][k]) for k in after)


def test_a_policy_may_start_from_another_agent_s_folder(make_config, tmp_path):
    config = make_config("lora")
    source = _trained_run(config, tmp_path / "src")
    config = config.replace(**{"model.init_from.run": str(tmp_path / "src"), "model.init_from.agents": {"echo": "writer"}})
    policies = build_policies(config, device=torch.device("cpu"))
    init_from(config, policies)
    echo = {k.replace(".echo.", "."): v for k, v in _state(policies.policies["echo"]).items()}
    writer = {k.replace(".writer.", "."): v for k, v in _state(source.policies["writer"]).items()}
    assert echo.keys() == writer.keys() and all(torch.equal(echo[k], writer[k]) for k in echo)


def test_it_refuses_an_adapter_for_a_whole_model_and_a_missing_step(make_config, tmp_path):
    _trained_run(make_config("lora"), tmp_path / "src")
    config = make_config("prompt").replace(**{"model.init_from.run": str(tmp_path / "src"), "model.init_from.agents": {"shared": "writer"}})
    with pytest.raises(ConfigError) as err:
        init_from(config, build_policies(config, device=torch.device("cpu")))
    assert err.value.field == "model.init_from.agents.shared" and "LoRA adapter" in str(err.value)
    with pytest.raises(FileNotFoundError, match="keeps steps 3"):
        checkpoint_folder(tmp_path / "src", 7)
    config = make_config("lora").replace(**{"model.init_from.run": str(tmp_path / "nothing")})
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        init_from(config, build_policies(config, device=torch.device("cpu")))
    for field, value, said in (("lora.r", 8, "lora.r 4, this run's is 8: set lora.r: 4"),
                               ("lora.alpha", 16, "lora.alpha 8, this run's is 16"),
                               ("lora.target_modules", ["q_proj"], "this run's is [q_proj]")):
        config = make_config("lora").replace(**{"model.init_from.run": str(tmp_path / "src"), field: value})
        with pytest.raises(ConfigError, match=re.escape(said)) as err:  # not torch's "size mismatch for base_model.model..."
            init_from(config, build_policies(config, device=torch.device("cpu")))
        assert err.value.field == "model.init_from.run"


def test_a_grpo_run_starts_from_the_warm_start(make_config, tmp_path):
    from training.trainer import train

    config = make_config("lora")
    _trained_run(config, tmp_path / "src")
    logs = []

    class Sink(NullSink):
        def log(self, message, *, level="info"):
            logs.append(message)

    train(config.replace(**{"model.init_from.run": str(tmp_path / "src"), "optim.steps": 1}), out_dir=tmp_path / "out", sink=Sink())
    assert any(m.startswith(f"started from {tmp_path / 'src' / 'checkpoints' / 'step-000003'} (step 3)") for m in logs)


@pytest.mark.parametrize("specialization", ["single", "prompt", "lora", "full"])
def test_after_a_warm_start_the_kl_reference_is_the_policy_the_run_starts_from(make_config, tmp_path, specialization):
    """GRPO and TRL measure the KL to the policy a run starts from: after `model.init_from`, not the
    base from before the warm start (whose KL at the first update was 0.115 in the report)."""
    config = make_config(specialization).replace(**{"grpo.beta": 0.1})
    _trained_run(config, tmp_path / "src")
    config = config.replace(**{"model.init_from.run": str(tmp_path / "src")})
    policies = build_policies(config, device=torch.device("cpu"))
    init_from(config, policies)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    for policy in policies.trainable():
        with torch.no_grad():
            with policy.active() as model:
                mine = model(input_ids=ids).logits  # (1, T, V)
            with policy.reference() as ref:
                theirs = ref(input_ids=ids).logits  # (1, T, V)
        assert torch.equal(mine, theirs), policy.name
        with policy.active():  # the policy trains on after its reference was read; the reference does not
            assert policy.params and all(p.requires_grad for p in policy.params)
            with torch.no_grad():
                for p in policy.params:
                    p.add_(0.1)
            with torch.no_grad():
                moved = policy.model(input_ids=ids).logits
        with torch.no_grad(), policy.reference() as ref:
            assert torch.equal(ref(input_ids=ids).logits, theirs) and not torch.equal(moved, theirs), policy.name


def test_evaluating_a_warm_started_config_without_a_checkpoint_evaluates_the_warm_start(make_config, tmp_path):
    """`python -m training eval CONFIG --set model.init_from.run=...` (no --checkpoint) evaluated the
    base models and said nothing: it now evaluates the weights a run of CONFIG starts from, the same
    examples as evaluating the source checkpoint itself."""
    from training.evaluation import evaluate_checkpoint

    config = make_config("lora", **{"eval.size": 4, "generation.temperature": 1.0})
    _trained_run(config, tmp_path / "src")
    def texts(results):
        return [[c["text"] for t in ep["turns"] for c in t["candidates"]] for ep in results[0]["episodes"]]

    warm = texts(evaluate_checkpoint(config.replace(**{"model.init_from.run": str(tmp_path / "src")}), None))
    source = texts(evaluate_checkpoint(config, tmp_path / "src" / "checkpoints" / "step-000003"))
    base = texts(evaluate_checkpoint(config, None))
    assert warm == source and warm != base


def test_the_untrained_ablation_and_the_playground_s_untrained_lane_start_from_the_warm_start(make_config, tmp_path):
    """Every place that shows a run's step 0 without a checkpoint (the `untrained` ablation, the
    playground's untrained lane) plays the weights the run started from: its warm start, the same
    text as the source checkpoint itself, not the base models'; the lane says so by name."""
    from training.ablation import Ablation, evaluate_ablation
    from training.playground import lane, play, untrained_label

    config = make_config("lora", **{"eval.size": 2})
    _trained_run(config, tmp_path / "src")
    warm_config = config.replace(**{"model.init_from.run": str(tmp_path / "src")})
    checkpoint = tmp_path / "src" / "checkpoints" / "step-000003"

    def ablation_texts(cfg):
        results = evaluate_ablation(cfg, None, Ablation("untrained"))
        return [[c["text"] for t in ep["turns"] for c in t["candidates"]] for ep in results[0]["episodes"]]

    assert ablation_texts(warm_config) != ablation_texts(config)

    def lane_texts(cfg, trained):
        (played,) = play(cfg, {"question": "2+3", "answer": "5"}, lanes=[lane("x", trained=trained)],
                         checkpoint=checkpoint if trained else None)
        return [(t["text"], t["policy"]) for t in played["turns"]]

    warm_lane, base_lane, source_lane = lane_texts(warm_config, False), lane_texts(config, False), lane_texts(config, True)
    assert [t for t, _ in warm_lane] == [t for t, _ in source_lane] != [t for t, _ in base_lane]
    assert all(p == f"warm start {tmp_path / 'src'}" for _, p in warm_lane)
    assert all(p.startswith("base model ") for _, p in base_lane)
    assert (untrained_label(warm_config), untrained_label(config)) == ("warm start", "base models")  # the lane's name
