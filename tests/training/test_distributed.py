"""Data-parallel training (`resources.gpus > 1`): the update over ranks equals the update over
the whole batch, and a torchrun launch relays rank 0's events to the caller's sink."""

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.training import _dist_update
from tests.training.conftest import toy_config
from training.checkpoints import restore, save_checkpoint
from training.config import ConfigError, RunConfig
from training.distributed import Dist, DistributedRunError, replay
from training.events import NullSink
from training.models import ModelLoadError, load_model
from training.placement import layout
from training.policies import build_policies, load_policy_weights
from training.runner import train
from training.sharding import shard_policies
from training.update import update_policy

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SPECIALIZATIONS = ["lora", "prompt"]


@pytest.fixture(scope="module")
def one_rank_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A checkpoint of a one-process `fsdp` run after one AdamW step, and its weights and optimizer state."""
    torch.manual_seed(0)
    config = _dist_update.fsdp_config("prompt")
    policies = build_policies(config, device=torch.device("cpu"))
    shard_policies(policies, config, Dist())  # one process: nothing to shard over
    policy = policies.for_agent("writer")
    update_policy(policy, _dist_update.samples(policy, 0, 4), config, step=1)
    path = save_checkpoint(tmp_path_factory.mktemp("one-rank"), 1, policies, torch.Generator().manual_seed(0), config, NullSink())
    return Path(path), {"params": _dist_update.flat_params(policy), "optim": _dist_update.optimizer_state(policy)}


@pytest.fixture(scope="module")
def two_rank_updates(tmp_path_factory: pytest.TempPathFactory, one_rank_checkpoint) -> Path:
    """Two gloo ranks, started once, each updating every specialization of SPECIALIZATIONS on its
    half, then running the FSDP cases (`_dist_update.fsdp_cases`)."""
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(_dist_update.rank_main, args=(2, _free_port(), str(out), SPECIALIZATIONS, str(one_rank_checkpoint[0])), nprocs=2, join=True)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("specialization", SPECIALIZATIONS)
def test_two_ranks_update_the_weights_as_one_process_does_on_the_whole_batch(two_rank_updates, specialization):
    ranks = [torch.load(two_rank_updates / f"{specialization}-rank{r}.pt") for r in range(2)]
    torch.manual_seed(0)
    config = toy_config(specialization)
    policy = _dist_update.sgd(build_policies(config, device=torch.device("cpu")).for_agent("writer"))
    before = _dist_update.flat_params(policy)
    whole = _dist_update.samples(policy, 0, 4) + _dist_update.samples(policy, 4, 3)
    stats = update_policy(policy, whole, config, step=1)
    after = _dist_update.flat_params(policy)
    assert not torch.allclose(before, after)
    for r in ranks:
        assert torch.allclose(r["params"], after, atol=1e-6), "a rank's weights differ from the whole-batch update"
        assert r["stats"]["samples"] == 7
        assert r["stats"]["grad_norm"] == pytest.approx(stats["grad_norm"], rel=1e-4)
        assert r["stats"]["loss"] == pytest.approx(stats["loss"], rel=1e-4, abs=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("specialization", ["prompt", "lora", "full"])
def test_fsdp_shards_the_model_and_updates_it_as_one_process_does_on_the_whole_batch(two_rank_updates, specialization):
    ranks = [torch.load(two_rank_updates / f"fsdp-{specialization}-rank{r}.pt") for r in range(2)]
    torch.manual_seed(0)
    config = _dist_update.fsdp_config(specialization)
    policy = _dist_update.sgd(build_policies(config, device=torch.device("cpu")).for_agent("writer"))  # one process, unsharded
    before = _dist_update.flat_params(policy)
    n0, n1 = _dist_update.FSDP_SPLIT
    stats = update_policy(policy, _dist_update.samples(policy, 0, n0) + _dist_update.samples(policy, n0, n1), config, step=1)
    after = _dist_update.flat_params(policy)  # SGD: after - before is the gradient, times -lr
    assert not torch.allclose(before, after)
    for r in ranks:
        assert torch.allclose(r["params"], after, atol=1e-6), "the sharded update differs from the whole-batch update"
        assert r["stats"]["samples"] == n0 + n1
        assert r["stats"]["grad_norm"] == pytest.approx(stats["grad_norm"], rel=1e-4)
        assert r["stats"]["loss"] == pytest.approx(stats["loss"], rel=1e-4, abs=1e-7)
        mine, total = r["share"]
        assert 0.45 < mine / total < 0.56, f"a rank holds {mine} of {total} (base) parameters, not about half"


@pytest.mark.slow
@pytest.mark.parametrize("specialization", ["prompt", "lora", "full"])
def test_no_whole_parameter_outlives_the_sharding(two_rank_updates, specialization):
    for r in range(2):
        kept = torch.load(two_rank_updates / f"fsdp-{specialization}-rank{r}.pt")["kept"]
        assert kept == 0, f"rank {r} still holds {kept} bytes of the unsharded parameters"


@pytest.mark.slow
@pytest.mark.parametrize("specialization", ["prompt", "full"])
def test_only_the_first_rank_loads_the_whole_weights_of_a_sharded_model(two_rank_updates, specialization):
    # rank 1 builds the model on the meta device and receives its shards from rank 0 (its update
    # equals the one-process update: test_fsdp_shards_the_model_and_updates_it_as_one_process_does_on_the_whole_batch)
    ranks = [torch.load(two_rank_updates / f"fsdp-{specialization}-rank{r}.pt") for r in range(2)]
    assert [r["on_meta"] for r in ranks] == [False, True]


@pytest.mark.slow
def test_an_fsdp_checkpoint_resumes_on_another_number_of_ranks(two_rank_updates, one_rank_checkpoint, tmp_path):
    folder, saved = one_rank_checkpoint
    assert (folder / "dcp" / "shared").is_dir() and (folder / "shared" / "model.safetensors").is_file()
    # 1 -> 2: both ranks restored the one-process weights and AdamW state, sharded
    for r in range(2):
        resumed = torch.load(two_rank_updates / f"resumed-rank{r}.pt")
        assert resumed["step"] == 1 and torch.equal(resumed["params"], saved["params"])
        assert resumed["optim"].keys() == saved["optim"].keys()
        for name, state in saved["optim"].items():
            assert all(torch.equal(resumed["optim"][name][k], v) for k, v in state.items()), name
    # 2 -> 1: the two ranks' checkpoint after one more step, restored in this process, unsharded
    ranks = torch.load(two_rank_updates / "resumed-rank0.pt")
    config = _dist_update.fsdp_config("prompt")
    policies = build_policies(config, device=torch.device("cpu"))
    step = restore(two_rank_updates / "resaved" / "checkpoints" / "step-000002", policies, torch.Generator(), config=config)
    policy = policies.for_agent("writer")
    assert step == 2 and torch.equal(_dist_update.flat_params(policy), ranks["after"])
    optim = _dist_update.optimizer_state(policy)
    for name, state in ranks["optim_after"].items():
        assert all(torch.equal(optim[name][k], v) for k, v in state.items()), name
    # the gathered Hugging Face folder (what exports read) holds the same weights
    hf = build_policies(config, device=torch.device("cpu"))
    load_policy_weights(hf, two_rank_updates / "resaved" / "checkpoints" / "step-000002")
    assert torch.equal(_dist_update.flat_params(hf.for_agent("writer")), ranks["after"])


@pytest.mark.slow
def test_a_sharded_run_and_a_placed_run_train_generate_and_checkpoint(two_rank_updates):
    sharded = torch.load(two_rank_updates / "fsdp-run.pt", weights_only=False)
    assert sharded["result"].status == "succeeded" and sharded["result"].step == 1
    assert [e[1] for e in sharded["events"] if e[0] == "evaluation"] == [0, 1]
    ckpt = Path(sharded["result"].checkpoint)
    assert (ckpt / "dcp" / "shared" / ".metadata").is_file() and (ckpt / "shared" / "config.json").is_file()

    placed = torch.load(two_rank_updates / "placed-run.pt", weights_only=False)
    assert placed["result"].status == "succeeded" and placed["result"].step == 2
    metrics = [e for e in placed["events"] if e[0] == "metrics"]
    assert [m[1] for m in metrics] == [1, 2]
    for _, _, _, agents in metrics:  # each agent's group reported its update
        assert {"writer", "echo"} <= set(agents) and all("lr" in agents[a] for a in ("writer", "echo"))
    rollouts = [ep for e in placed["events"] if e[0] == "rollouts" for ep in e[2]]
    served = {t["agent"]: t["policy"] for ep in rollouts for t in ep["turns"]}
    assert served == {"writer": "writer model on ranks [0]", "echo": "echo model on ranks [1]"}
    assert [e[1] for e in placed["events"] if e[0] == "evaluation"] == [0, 2]
    ckpt = Path(placed["result"].checkpoint)
    for agent in ("writer", "echo"):
        assert (ckpt / "dcp" / agent / ".metadata").is_file() and (ckpt / agent / "config.json").is_file()
    # each rank built its own agent's model only
    assert torch.load(two_rank_updates / "placed-held-rank0.pt") == {"writer": True, "echo": False}
    assert torch.load(two_rank_updates / "placed-held-rank1.pt") == {"writer": False, "echo": True}


class Recorder(NullSink):
    def __init__(self, stop_after: int | None = None):
        self.events: list[tuple] = []
        self.stop_after = stop_after

    def run_started(self, *, total_steps, start_step):
        self.events.append(("run_started", total_steps, start_step))

    def metrics(self, m):
        self.events.append(("metrics", m.step, m.values))

    def rollouts(self, step, episodes):
        self.events.append(("rollouts", step, episodes))

    def checkpoint(self, step, path):
        self.events.append(("checkpoint", step, path))

    def evaluation(self, result):
        self.events.append(("evaluation", result["step"], result))

    def status(self, phase, detail, *, progress=None, eta=None):
        self.events.append(("status", phase, detail))

    def should_stop(self):
        return self.stop_after is not None and sum(e[0] == "metrics" for e in self.events) >= self.stop_after

    def of(self, kind):
        return [e for e in self.events if e[0] == kind]


def _launch_config(**overrides) -> RunConfig:
    return RunConfig.load(ROOT / "configs/tiny-lora.yaml").replace(
        **{"resources.gpus": 2, "optim.tasks_per_step": 4, "data.train_size": 16, "eval.every": 2, "eval.size": 4, "checkpoint.every": 0, **overrides}
    )


@pytest.mark.slow  # a torchrun launch
def test_a_two_process_launch_trains_and_relays_every_event_of_the_whole_step(tmp_path):
    sink = Recorder()
    result = train(_launch_config(), out_dir=tmp_path, sink=sink)
    assert result.status == "succeeded" and result.step == 2
    assert sink.of("run_started") == [("run_started", 2, 0)]
    assert [e[1] for e in sink.of("metrics")] == [1, 2]
    # each rank rolled out 2 of the step's 4 tasks; rank 0 reports all 4 episodes
    assert [e[1] for e in sink.of("rollouts")] == [1, 2]
    for _, _, episodes in sink.of("rollouts"):
        assert len(episodes) == 4 and len({ep["task_id"] for ep in episodes}) == 4
    assert [e[1] for e in sink.of("evaluation")] == [0, 2]
    assert [e[2] for e in sink.of("status") if e[1] == "training"] == ["Training step 1 of 2", "Training step 2 of 2"]
    ckpt = Path(result.checkpoint)
    assert sink.of("checkpoint")[-1][2] == str(ckpt)
    assert not (tmp_path / "relay.jsonl").exists() and (tmp_path / "launch.log").exists()
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert len(state["generators"]) == 2 and not torch.equal(state["generators"][0], state["generators"][1])


@pytest.mark.slow  # a torchrun launch
def test_a_stop_request_reaches_every_rank(tmp_path):
    # the launcher passes the request on at its first poll, before the ranks reach step 1; a rank
    # that missed it would wait in the next collective call forever instead of finishing
    sink = Recorder(stop_after=0)
    result = train(_launch_config(**{"optim.steps": 5, "eval.every": 0}), out_dir=tmp_path, sink=sink)
    assert result.status == "cancelled" and result.step == 0
    assert (Path(result.checkpoint) / "trainer_state.pt").exists()
    assert sink.of("metrics") == []


@pytest.mark.slow  # a torchrun launch
def test_a_stop_request_mid_run_stops_within_a_few_steps(tmp_path):
    sink = Recorder(stop_after=1)
    result = train(_launch_config(**{"optim.steps": 20, "eval.every": 0}), out_dir=tmp_path, sink=sink)
    # the launcher sees step 1 within its poll interval; the ranks stop at a following step boundary
    assert result.status == "cancelled" and 1 <= result.step < 20
    assert [e[1] for e in sink.of("metrics")] == list(range(1, result.step + 1))


@pytest.mark.slow  # a torchrun launch
def test_a_failing_rank_fails_the_run_with_its_error(tmp_path):
    config = _launch_config(**{"data.reward_fn": "tests.faults.plugins:exploding_reward"})
    with pytest.raises(DistributedRunError, match="reward plugin exploded"):
        train(config, out_dir=tmp_path, sink=NullSink())


def test_replay_ignores_the_launchers_own_records():
    replay({"type": "unknown"}, NullSink())


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"resources.gpus": 0}, "resources.gpus"),
        ({"resources.parallel": "pipeline"}, "resources.parallel"),
        ({"resources.parallel": "agents"}, "resources.parallel"),  # tiny-lora is `lora`, not `full`
        ({"resources.gpus": 4, "optim.tasks_per_step": 2}, "optim.tasks_per_step"),
        ({"model.quantization": "8bit"}, "model.quantization"),
        ({"model.quantization": "4bit", "topology.specialization": "prompt"}, "model.quantization"),
    ],
)
def test_resource_settings_are_checked_by_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        RunConfig.load(ROOT / "configs/tiny-lora.yaml").replace(**overrides)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("placement", "overrides", "message"),
    [
        ({"tool": 1, "reasoner": 1}, {"topology.specialization": "lora"}, "needs the `full` specialization"),
        ({"tool": 1, "reasoner": 1}, {"resources.parallel": "agents"}, "needs resources.parallel `data` or `fsdp`"),
        ({"tool": 1, "critic": 1}, {}, "names no agent of the topology: critic"),
        ({"tool": 2}, {}, "missing: reasoner"),
        ({"tool": 0, "reasoner": 2}, {}, "at least 1: tool"),
        ({"tool": 2, "reasoner": 1}, {}, "the ranks sum to 3, but resources.gpus is 2"),
    ],
)
def test_a_placement_must_name_every_agent_and_sum_to_the_gpus(placement, overrides, message):
    base = {"topology.specialization": "full", "resources.gpus": 2, "resources.parallel": "fsdp", **overrides}
    with pytest.raises(ConfigError, match=message) as err:
        RunConfig.load(ROOT / "configs/tiny-lora.yaml").replace(**base, **{"resources.placement": placement})
    assert err.value.field == "resources.placement"


def test_a_good_placement_lays_out_the_ranks_in_acting_order():
    config = RunConfig.load(ROOT / "configs/tiny-lora.yaml").replace(
        **{"topology.specialization": "full", "resources.gpus": 3, "resources.parallel": "data", "optim.tasks_per_step": 3,
           "resources.placement": {"reasoner": 2, "tool": 1}}
    )
    assert layout(config) == {"tool": (0,), "reasoner": (1, 2)}
    assert RunConfig.from_yaml(config.to_yaml()).resources.placement == {"reasoner": 2, "tool": 1}


def test_a_4bit_base_on_the_cpu_says_what_it_needs():
    with pytest.raises(ModelLoadError, match="4bit needs a CUDA GPU"):
        load_model("tiny-random:llama", device="cpu", quantization="4bit")
