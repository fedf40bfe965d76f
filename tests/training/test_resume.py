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
