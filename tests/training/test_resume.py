"""Resume equivalence: 2 steps, then resume for 2 more, equals 4 straight steps (same seed)."""

import torch

from training.events import NullSink
from training.policies import build_policies, load_policy_weights
from training.trainer import train


def _weights(config, checkpoint):
    policies = build_policies(config, device=torch.device("cpu"))
    load_policy_weights(policies, checkpoint)
    model = policies.for_agent("writer").model
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_it_resumes_exactly_where_it_stopped(make_config, tmp_path):
    straight = make_config("lora", **{"optim.steps": 4})
    full = train(straight, out_dir=tmp_path / "straight", sink=NullSink())

    first = train(straight.replace(**{"optim.steps": 2}), out_dir=tmp_path / "a", sink=NullSink())
    assert first.step == 2 and first.checkpoint
    resumed = train(straight.replace(**{"checkpoint.resume_from": first.checkpoint}), out_dir=tmp_path / "b", sink=NullSink())
    assert resumed.step == 4

    a, b = _weights(straight, full.checkpoint), _weights(straight, resumed.checkpoint)
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    moved = _weights(straight, first.checkpoint)
    assert any(not torch.equal(moved[n], a[n]) for n in a), "steps 3-4 changed nothing"


def test_it_stops_when_the_sink_asks_and_saves_a_checkpoint(make_config, tmp_path):
    class StopAfterOne(NullSink):
        def __init__(self):
            self.calls = 0

        def should_stop(self):
            self.calls += 1
            return self.calls > 1

    result = train(make_config("lora", **{"optim.steps": 5}), out_dir=tmp_path, sink=StopAfterOne())
    assert result.status == "cancelled" and result.step == 1
    assert result.checkpoint and (tmp_path / "checkpoints" / "step-000001" / "trainer_state.pt").exists()


def test_it_refuses_to_resume_with_a_changed_data_order_unless_told(make_config, tmp_path):
    import pytest

    from training.config import ConfigError

    config = make_config("lora", **{"optim.steps": 1})
    first = train(config, out_dir=tmp_path / "a", sink=NullSink())
    changed = make_config("lora", **{"optim.steps": 2, "optim.tasks_per_step": 3, "checkpoint.resume_from": first.checkpoint})

    with pytest.raises(ConfigError) as err:
        train(changed, out_dir=tmp_path / "b", sink=NullSink())
    assert err.value.field == "checkpoint.resume_from"
    assert "optim.tasks_per_step: 2 -> 3" in err.value.message and "allow_config_changes" in err.value.message

    # a field that keeps the order (the learning rate) may change; the override resumes anyway
    assert train(changed.replace(**{"optim.tasks_per_step": 2, "optim.lr": 5e-3}), out_dir=tmp_path / "c", sink=NullSink()).step == 2
    assert train(changed.replace(**{"checkpoint.allow_config_changes": True}), out_dir=tmp_path / "d", sink=NullSink()).step == 2
