"""Generation on CPU against this machine's roofline: Troupe's decode loop and its candidates side by side.

    .venv/bin/python bench/generation.py [--rounds 3] [--prompts 4] [--n 4] [--max-new-tokens 48]
                                         [--threads 1] [--no-llama] [--compile] [--probes] [--profile] [--out bench/results/generation.json]

- Roofline: the model's matmuls at the decode shapes (each layer's q, k, v, o, gate, up and down
  projections and the output head, at a batch of prompts x n rows, fp32, the torch threads given),
  each timed in blocks of calls, best block kept (what the core can do at that shape). One decode
  step's matmuls take layers x (sum of the layer's shapes) + head; the roofline is rows / that time,
  in tokens/s. The model's per-token FLOPs are 2 x its matmul weights (attention over the context
  is left out: a few % at these lengths). Each weight stays in the cache across its block, so
  this is the core's compute side only.
- Matmul floor (`MatmulFloor`): the same matmuls with the model's own weights, in the model's order,
  so each comes from memory as it does in a forward (the model is many times the caches). Each
  candidate's call is charged what its own work costs there: the prefill of its prompt tokens
  plus one decode step per token position at the rows still running then (a shrinking batch
  reads the same weights for fewer tokens). `% matmul floor` = that / the call's CPU time: the
  share of the call that an fp32 engine doing nothing but those matmuls would still need.
- Candidates, on the same chat-templated prompts, interleaved round by round (each round runs every
  candidate once, temperature 1, the round's seed; every other round in reverse order; a short
  warm-up call each first), so the neighbours' load falls on all of them:
  `before` (the loop as it was: transformers' DynamicCache, `torch.multinomial`), `reserved cache`
  (keys/values written in place into reserved room), `cdf sampler (default)` (one uniform draw per
  row, inverted in two levels: what `training.generation.generate` now does), and `both`.
  `--compile`: `HF static cache + torch.compile` (transformers' `generate` with a static cache and
  its decode step compiled, `CompiledArm`; its start-up is the compile). `llama.cpp f32 (backend)` and `llama.cpp bf16
  (backend)`: the `llamacpp` generation backend as a run uses it (`LlamaCppArm`: Troupe's sampler over
  llama.cpp's batched logits, the weights in a mapped GGUF file); its start-up (write the GGUF, load
  it) and one push of every weight into the mapped file (what a run pays after each update) are printed.
- Tokens/s by CPU time (user+system of this process, one torch thread): on a shared machine wall
  time measures the neighbours. Wall tokens/s are printed beside it.
- Exactness: greedy (temperature 0, one row per prompt) tokens of each candidate against `before`'s; for llama.cpp also
  its log-probs of its own greedy tokens against the trainer's (teacher-forced, transformers fp32).
- `--probes`: the floor's decode step at fewer rows, with q/k/v and gate/up fused into one matmul
  each, and the output head in fp32 against bf16 (`layout_probes`).
- `--profile`: torch.profiler over one `before` and one `cdf sampler (default)` call, top operators by self time.

The machine is shared: read the load averages printed at the start and end (also in the JSON).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _common import RESULTS, command_line, machine, table, write_json  # noqa: E402

from training import generation as gen  # noqa: E402
from training.async_rollout import shadow_policies  # noqa: E402
from training.policies import Policy, PolicySet  # noqa: E402

BF16 = "bf16 copy (generation.dtype)"

QUESTIONS = [
    "A shop sells pens at 3 dollars each. Tom buys 17 pens and pays with a 100 dollar bill. How much change does he get?",
    "What is the sum of the integers from 1 to 250 that are divisible by 7?",
    "A train travels 180 km in 2.5 hours. At the same speed, how far does it go in 4 hours?",
    "Sara has 48 apples. She gives a third to Ben and a quarter of the rest to Ann. How many are left?",
    "How many prime numbers are there below 100?",
    "A rectangle is 12 cm by 7 cm. What is the length of its diagonal, rounded to two decimals?",
    "What is 2 to the power 20 minus 3 to the power 11?",
    "If 5 workers build a wall in 12 days, how many days do 8 workers take?",
]
SYSTEM = "You solve arithmetic problems by writing a short Python program in a ```python code block that prints the answer."


def cpu_now() -> float:
    """CPU seconds of this process (all its threads, llama.cpp's included), at the clock's resolution."""
    return time.process_time()


# == roofline ======================================================================================


def decode_shapes(config: Any) -> tuple[int, dict[str, tuple[int, int]], tuple[int, int]]:
    """(layers, {projection: (in, out)} of one layer, (in, out) of the output head) for a Llama-like config."""
    h, heads = config.hidden_size, config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    hd = getattr(config, "head_dim", None) or h // heads
    inter = config.intermediate_size
    layer = {"q": (h, heads * hd), "k": (h, kv * hd), "v": (h, kv * hd), "o": (heads * hd, h), "gate": (h, inter), "up": (h, inter), "down": (inter, h)}
    return config.num_hidden_layers, layer, (h, config.vocab_size)


def time_linear(rows: int, shape: tuple[int, int], *, calls: int, blocks: int, dtype: torch.dtype = torch.float32) -> float:
    """Best seconds per call of x (rows, in) @ W (out, in)^T, by CPU time, over `blocks` blocks of `calls`."""
    x, w = torch.randn(rows, shape[0], dtype=dtype), torch.randn(shape[1], shape[0], dtype=dtype)
    for _ in range(3):
        F.linear(x, w)
    best = float("inf")
    for _ in range(blocks):
        c = cpu_now()
        for _ in range(calls):
            F.linear(x, w)
        best = min(best, (cpu_now() - c) / calls)
    return best


def roofline(config: Any, rows: int, *, blocks: int = 5, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    layers, layer, head = decode_shapes(config)
    per_shape = {}
    for name, shape in [*layer.items(), ("head", head)]:
        calls = min(400, max(20, int(2e8 / (2 * rows * shape[0] * shape[1]))))  # about 0.1-0.2 s per block on one core
        secs = time_linear(rows, shape, calls=calls, blocks=blocks, dtype=dtype)
        per_shape[name] = {"in": shape[0], "out": shape[1], "seconds": secs, "gflops": 2 * rows * shape[0] * shape[1] / secs / 1e9}
    step = layers * sum(per_shape[k]["seconds"] for k in layer) + per_shape["head"]["seconds"]
    weights = layers * sum(i * o for i, o in layer.values()) + head[0] * head[1]
    return {
        "rows": rows,
        "layers": layers,
        "per_shape": per_shape,
        "flops_per_token": 2 * weights,
        "step_seconds": step,
        "tokens_per_s": rows / step,
        "gflops": 2 * weights * rows / step / 1e9,
    }


def streamed_seconds(model: Any, rows: int, head_rows: int, *, blocks: int = 5) -> float:
    """Best CPU seconds of one forward's matmuls with the model's own weights, in the model's order:
    every `nn.Linear` (each layer's projections, then the output head) once, `rows` rows through the
    layers and `head_rows` through the head. Unlike `roofline`, whose one weight stays in the cache
    across a block of calls, each weight here comes from memory as it does in a real forward (the
    model is far larger than the caches), so this is the floor of an fp32 forward on this core: the
    same matmuls and nothing else (no attention, norms, sampling or framework)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    head = model.get_output_embeddings()
    inputs: dict[tuple[int, int], torch.Tensor] = {}  # (in, rows) -> x, shared by the weights of that shape
    calls = []
    for m in linears:
        n = head_rows if m is head else rows
        calls.append((inputs.setdefault((m.in_features, n), torch.randn(n, m.in_features)), m.weight))
    return best_cpu_seconds(calls, blocks=blocks)


def best_cpu_seconds(calls: list[tuple[torch.Tensor, torch.Tensor]], *, blocks: int) -> float:
    """Best CPU seconds over `blocks` runs of `F.linear(x, w)` for each (x, w) of `calls` in turn,
    after one warm-up run (first-touch allocations)."""
    with torch.inference_mode():
        for a, w in calls:
            F.linear(a, w)
        best = float("inf")
        for _ in range(blocks):
            c = cpu_now()
            for a, w in calls:
                F.linear(a, w)
            best = min(best, cpu_now() - c)
    return best


def layout_probes(model: Any, rows: int, *, blocks: int = 6) -> dict[str, float]:
    """What a different weight layout or precision would change in the floor's decode step, in
    seconds: the step at rows/2 and rows/4 (a shrinking batch), the step with each layer's q/k/v
    and gate/up weights concatenated into one matmul each (fewer, wider calls over the same bytes),
    and the output head alone in fp32 and in bf16 (half the bytes; not the trainer's numbers)."""
    out = {f"step_{r}_rows": streamed_seconds(model, r, r) for r in (rows, max(1, rows // 2), max(1, rows // 4))}
    fused = []
    for m in model.modules():
        attn, mlp = getattr(m, "self_attn", None), getattr(m, "mlp", None)
        if attn is None or mlp is None or not hasattr(attn, "q_proj") or not hasattr(mlp, "gate_proj"):
            continue
        fused += [torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]), attn.o_proj.weight,
                  torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), mlp.down_proj.weight]
    head = model.get_output_embeddings().weight
    fused.append(head)
    x = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in fused}

    out["step_fused_qkv_gate_up"] = best_cpu_seconds([(x[w.shape[1]], w) for w in fused], blocks=blocks)
    out["head_fp32"] = best_cpu_seconds([(x[head.shape[1]], head)], blocks=blocks)
    out["head_bf16"] = best_cpu_seconds([(x[head.shape[1]].bfloat16(), head.bfloat16())], blocks=blocks)
    return out


class MatmulFloor:
    """The matmul floor of a generate call's own work (`streamed_seconds`): the prefill of its real
    prompt tokens (the head at one row per prompt, as `logits_to_keep=1` computes) plus one decode
    forward per step at the rows still running then. Rows leave the batch as they finish, and a
    step of 3 rows reads the same weights as a step of 16: a shrinking batch costs more per token,
    which a roofline at the full batch does not see. Step times are measured once per row count."""

    def __init__(self, model: Any) -> None:
        self.model, self.steps, self.prefills = model, {}, {}  # type: ignore[var-annotated]

    def decode_step(self, rows: int) -> float:
        if rows not in self.steps:
            self.steps[rows] = streamed_seconds(self.model, rows, rows)
        return self.steps[rows]

    def prefill(self, tokens: int, prompts: int) -> float:
        if (tokens, prompts) not in self.prefills:
            self.prefills[(tokens, prompts)] = streamed_seconds(self.model, tokens, prompts, blocks=2)
        return self.prefills[(tokens, prompts)]

    def seconds(self, prompts: list[list[int]], completions: list[tuple[int, ...]]) -> float:
        """Floor seconds for `prompts` each sampled len(completions) / len(prompts) times. A row of
        length L needed L - 1 decode forwards (its first token came from the prefill's logits)."""
        lengths = [len(c) for c in completions]
        total = self.prefill(sum(len(p) for p in prompts), len(prompts))
        for t in range(max(lengths, default=1) - 1):
            total += self.decode_step(sum(1 for n in lengths if n > t + 1))
        return total


# == candidates ====================================================================================


class HFArm:
    def __init__(self, name: str, model: Any, tokenizer: Any, *, kv_cache: str, sampler: Any) -> None:
        self.name, self.model, self.tokenizer, self.kv_cache, self.sampler = name, model, tokenizer, kv_cache, sampler

    def generate(self, prompts: list[list[int]], *, n: int, max_new_tokens: int, temperature: float, seed: int) -> list[list[tuple[int, ...]]]:
        real = gen._sample
        gen._sample = self.sampler
        try:
            out = gen.generate(self.model, self.tokenizer, prompts, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                               generator=torch.Generator().manual_seed(seed), kv_cache=self.kv_cache)
        finally:
            gen._sample = real
        return [[g.token_ids for g in group] for group in out]


class CompiledArm:
    """Hugging Face `generate` with a static KV cache and its decode step under `torch.compile`
    (transformers' own auto-compile, allowed on CPU by `CompileConfig(_compile_all_devices=True)`).
    Its prefill is not shared by the n samples (`num_return_sequences` repeats the prompts first),
    and a finished row keeps its place in the static batch until every row is done. Each new batch
    shape compiles again; `startup_s` is the first call at the measured shape, compile included."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        from transformers import CompileConfig

        self.name, self.model, self.tokenizer = "HF static cache + torch.compile", model, tokenizer
        self.stops = gen.stop_token_ids(model, tokenizer)
        self.compile = CompileConfig(mode="default")  # "reduce-overhead" means CUDA graphs
        self.compile._compile_all_devices = True
        self.startup_s: dict[str, float] = {}

    def generate(self, prompts: list[list[int]], *, n: int, max_new_tokens: int, temperature: float, seed: int) -> list[list[tuple[int, ...]]]:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # (B, P) left padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # (B, P)
        sample = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {"do_sample": False}
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, num_return_sequences=n,
                                      cache_implementation="static", compile_config=self.compile, eos_token_id=self.stops,
                                      pad_token_id=pad, **sample)
        rows = []
        for row in out[:, width:].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in self.stops), len(row))  # through the end-of-turn token
            rows.append(tuple(row[:cut]))
        return [rows[b * n:(b + 1) * n] for b in range(len(prompts))]

    def warm(self, prompts: list[list[int]], *, n: int, max_new_tokens: int) -> None:
        for temperature, k in ((1.0, n), (0.0, 1)):  # the rounds' shape and the greedy check's
            c = cpu_now()
            self.generate(prompts, n=k, max_new_tokens=max_new_tokens, temperature=temperature, seed=0)
            self.startup_s[f"{len(prompts)}x{k}"] = cpu_now() - c


class LlamaCppArm:
    """The `llamacpp` generation backend (`training.llamacpp_backend.LlamaCppGenerator`) as a run
    uses it: Troupe's sampler over llama.cpp's logits, batched, on a GGUF file of the model's
    weights in `dtype`'s type (`model`: F32, `bfloat16`: BF16). `sync`: the start-up (write the
    GGUF, load it) and one push of every weight into the mapped file (a run's per-step cost)."""

    def __init__(self, model: Any, tokenizer: Any, dtype: str, threads: int) -> None:
        from training.config import RunConfig
        from training.llamacpp_backend import LlamaCppGenerator

        self.name = f"llama.cpp {'f32' if dtype == 'model' else 'bf16'} (backend)"
        self.policy = Policy("m", model, tokenizer, ("m",), trainable=False)
        # the engine reads only the run's generation settings; any valid run config carries them
        config = RunConfig.load(Path(__file__).resolve().parents[1] / "configs" / "tiny-lora.yaml").replace(
            **{"generation.backend": "llamacpp", "generation.dtype": dtype})
        self.engine = LlamaCppGenerator(config, PolicySet({"m": self.policy}, {"m": "m"}, "single"), threads=threads)
        t0, c0 = time.perf_counter(), cpu_now()
        self.engine.generate(self.policy, [[0]], n=1, max_new_tokens=1, temperature=0.0)  # write and load the GGUF
        t1, c1 = time.perf_counter(), cpu_now()
        self.engine.weights_changed(self.policy)
        self.engine.generate(self.policy, [[0]], n=1, max_new_tokens=1, temperature=0.0)  # one push of every weight
        self.sync = {"startup_s": t1 - t0, "startup_cpu_s": c1 - c0, "push_s": time.perf_counter() - t1, "push_cpu_s": cpu_now() - c1}

    def generate(self, prompts: list[list[int]], *, n: int, max_new_tokens: int, temperature: float, seed: int) -> list[list[tuple[int, ...]]]:
        out = self.engine.generate(self.policy, prompts, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                                   generator=torch.Generator().manual_seed(seed))
        return [[g.token_ids for g in group] for group in out]

    def logprobs(self, prompt: list[int], completion: tuple[int, ...]) -> list[float]:
        """llama.cpp's log-prob of each token of its own greedy completion, as a run records it."""
        (group,) = self.engine.generate(self.policy, [prompt], n=1, max_new_tokens=len(completion), temperature=0.0)
        assert group[0].token_ids == completion and group[0].logprobs is not None
        return list(group[0].logprobs)


@torch.inference_mode()
def trainer_logprobs(model: Any, prompt: list[int], completion: tuple[int, ...]) -> list[float]:
    ids = torch.tensor([prompt + list(completion)])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1].double()  # (T, V)
    return logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1).tolist()


def profile_once(arm: HFArm, prompts: list[list[int]], args: argparse.Namespace) -> list[list[Any]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        arm.generate(prompts, n=args.n, max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [[arm.name, e.key, e.count, e.self_cpu_time_total / 1e6, e.self_cpu_time_total / total] for e in events[:8]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-llama", action="store_true", help="leave out llama.cpp")
    parser.add_argument("--no-bf16", action="store_true", help="leave out the bfloat16 sampling copy (generation.dtype: bfloat16)")
    parser.add_argument("--compile", action="store_true", help="add Hugging Face generate with a static cache under torch.compile")
    parser.add_argument("--probes", action="store_true", help="also time the floor's step at fewer rows, with fused q/k/v and gate/up "
                        "weights, and the output head in fp32 and bf16 (`layout_probes`)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", default=str(RESULTS / "generation.json"))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    torch.set_num_threads(args.threads)
    from training.models import load_model

    start = machine()
    print(f"load average at start: {start['loadavg']}", flush=True)
    model, tok = load_model(args.model, device="cpu", dtype="float32")
    model.eval()
    prompts = [list(tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]) for q in (QUESTIONS * 4)[: args.prompts]]
    rows = args.prompts * args.n
    roof = roofline(model.config, rows)
    print(table(["shape", "in", "out", "ms/call", "GFLOPS"],
                [[k, v["in"], v["out"], v["seconds"] * 1e3, v["gflops"]] for k, v in roof["per_shape"].items()]))
    print(f"roofline at {rows} rows: {roof['tokens_per_s']:.0f} tokens/s ({roof['gflops']:.1f} GFLOPS, "
          f"{roof['flops_per_token'] / 1e9:.3f} GFLOP/token, {roof['step_seconds'] * 1e3:.1f} ms per decode step)", flush=True)
    floor = MatmulFloor(model)
    streamed = floor.decode_step(rows)
    roof["streamed_step_seconds"], roof["streamed_tokens_per_s"] = streamed, rows / streamed
    print(f"the same step with the model's own weights read from memory: {streamed * 1e3:.1f} ms, {rows / streamed:.0f} tokens/s "
          f"({roof['flops_per_token'] * rows / streamed / 1e9:.1f} GFLOPS)", flush=True)

    arms: list[Any] = [
        HFArm("before", model, tok, kv_cache="dynamic", sampler=gen._multinomial_sample),
        HFArm("reserved cache", model, tok, kv_cache="reserved", sampler=gen._multinomial_sample),
        HFArm("cdf sampler (default)", model, tok, kv_cache="dynamic", sampler=gen._sample),
        HFArm("both", model, tok, kv_cache="reserved", sampler=gen._sample),
    ]
    bf16 = None
    if not args.no_bf16:  # the run's sampling copy of `generation.dtype: bfloat16`, made as a run makes it
        copies, _ = shadow_policies(PolicySet({"m": Policy("m", model, tok, ("m",), trainable=False)}, {"m": "m"}, "single"), torch.bfloat16)
        bf16 = HFArm(BF16, copies.for_agent("m").model, tok, kv_cache="dynamic", sampler=gen._sample)
        arms.append(bf16)
        roof_bf16 = roofline(model.config, rows, dtype=torch.bfloat16)
        roof["bf16"] = {k: roof_bf16[k] for k in ("step_seconds", "tokens_per_s", "gflops")}
        print(f"bf16 roofline at {rows} rows: {roof_bf16['tokens_per_s']:.0f} tokens/s ({roof_bf16['gflops']:.1f} GFLOPS, "
              f"{roof_bf16['step_seconds'] * 1e3:.1f} ms per decode step)", flush=True)
    probes: dict[str, float] = {}
    if args.probes:
        probes = layout_probes(model, rows)
        print(table(["probe", "ms"], [[k, v * 1e3] for k, v in probes.items()]), flush=True)
    compiled = None
    if args.compile:
        compiled = CompiledArm(model, tok)
        compiled.warm(prompts, n=args.n, max_new_tokens=args.max_new_tokens)
        arms.append(compiled)
        print(f"torch.compile start-up, CPU s per batch shape (compile + first call): {compiled.startup_s}", flush=True)
    llamas: list[LlamaCppArm] = []
    if not args.no_llama:
        llamas = [LlamaCppArm(model, tok, dtype, args.threads) for dtype in ("model", "bfloat16")]
        arms += llamas
        for llama in llamas:
            print(f"{llama.name} start-up and one push of every weight: {llama.sync}", flush=True)

    profile_rows = []
    if args.profile:
        profile_rows = profile_once(arms[0], prompts, args) + profile_once(arms[2], prompts, args)
        print(table(["arm", "operator", "calls", "self s", "share"], profile_rows), flush=True)

    kw = {"n": args.n, "max_new_tokens": args.max_new_tokens}
    runs: dict[str, list[dict[str, float]]] = {a.name: [] for a in arms}
    for arm in arms:  # warm up: first-call allocations, llama.cpp's first evaluation
        arm.generate(prompts[:1], n=1, max_new_tokens=4, temperature=1.0, seed=0)
    for r in range(1, args.rounds + 1):
        for arm in arms if r % 2 else arms[::-1]:  # every other round backwards: a drift in the load falls on all
            w, c = time.perf_counter(), cpu_now()
            out = arm.generate(prompts, temperature=1.0, seed=r, **kw)
            w, c = time.perf_counter() - w, cpu_now() - c
            tokens = sum(len(t) for group in out for t in group)
            floor_s = floor.seconds(prompts, [t for group in out for t in group])
            runs[arm.name].append({"wall_s": w, "cpu_s": c, "tokens": tokens, "floor_s": floor_s, "load_1min": os.getloadavg()[0]})
        print(f"round {r}: " + " | ".join(f"{a.name} {runs[a.name][-1]['tokens'] / runs[a.name][-1]['cpu_s']:.1f} tok/cpu-s"
                                          for a in arms if runs[a.name]), flush=True)

    greedy = {a.name: a.generate(prompts, n=1, max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0) for a in arms}  # n copies would be equal
    ref = [t for group in greedy["before"] for t in group]
    summary: dict[str, Any] = {}
    for arm in arms:
        rs = runs[arm.name]
        mine = [t for group in greedy[arm.name] for t in group]
        tok_cpu = sum(x["tokens"] for x in rs) / sum(x["cpu_s"] for x in rs)
        summary[arm.name] = {
            "tokens_per_cpu_s": tok_cpu,
            "tokens_per_wall_s": sum(x["tokens"] for x in rs) / sum(x["wall_s"] for x in rs),
            "cpu_s_median": statistics.median(x["cpu_s"] for x in rs),
            "tokens_mean": statistics.fmean(x["tokens"] for x in rs),
            "roofline_share": tok_cpu / roof["tokens_per_s"],
            "floor_share": sum(x["floor_s"] for x in rs) / sum(x["cpu_s"] for x in rs),
            "greedy_rows_identical": sum(a == b for a, b in zip(mine, ref)) / len(ref),
        }
    base = summary["before"]["tokens_per_cpu_s"]
    for s in summary.values():
        s["x_before"] = s["tokens_per_cpu_s"] / base
    for llama in llamas:
        diffs = []
        for p, group in zip(prompts, greedy[llama.name]):
            a, b = llama.logprobs(p, group[0]), trainer_logprobs(model, p, group[0])
            diffs += [abs(x - y) for x, y in zip(a, b)]
        summary[llama.name]["logprob_abs_diff"] = {"mean": statistics.fmean(diffs), "max": max(diffs)}
        summary[llama.name]["sync"] = llama.sync
        llama.engine.close()
    if compiled is not None:
        summary[compiled.name]["startup_cpu_s"] = compiled.startup_s
    if bf16 is not None:  # the copy's own log-probs of its greedy tokens (what the importance weights read) against the trainer's
        diffs = []
        got = gen.generate(bf16.model, tok, prompts, n=1, max_new_tokens=args.max_new_tokens, temperature=0.0, logprobs=True)
        for p, (g,) in zip(prompts, got):
            diffs += [abs(x - y) for x, y in zip(g.logprobs, trainer_logprobs(model, p, g.token_ids))]
        summary[BF16]["logprob_abs_diff"] = {"mean": statistics.fmean(diffs), "max": max(diffs)}
        summary[BF16]["bf16_roofline_share"] = summary[BF16]["tokens_per_cpu_s"] / roof["bf16"]["tokens_per_s"]
    end = machine()
    print(table(["candidate", "tok/cpu-s", "x before", "% roofline", "% matmul floor", "tok/wall-s", "mean tokens", "greedy rows = before"],
                [[k, v["tokens_per_cpu_s"], v["x_before"], 100 * v["roofline_share"], 100 * v["floor_share"], v["tokens_per_wall_s"], v["tokens_mean"],
                  f"{v['greedy_rows_identical']:.0%}"] for k, v in summary.items()]))
    for llama in llamas:
        share = f"; {100 * summary[llama.name]['tokens_per_cpu_s'] / roof['bf16']['tokens_per_s']:.1f} % of the bf16 roofline" if "bf16" in roof else ""
        print(f"{llama.name}: log-prob |diff| against the trainer on its greedy tokens {summary[llama.name]['logprob_abs_diff']}{share}")
    if bf16 is not None:
        print(f"{BF16}: {100 * summary[BF16]['bf16_roofline_share']:.1f} % of the bf16 roofline; its log-prob |diff| against the "
              f"trainer on its greedy tokens: {summary[BF16]['logprob_abs_diff']}")
    print(f"load average: start {start['loadavg']}, end {end['loadavg']}")
    payload = {"command": command_line(), "machine_start": start, "machine_end": end, "roofline": roof, "candidates": summary, "rounds": runs, "probes": probes,
               "profile": profile_rows, "setup": {"prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens, "model": args.model}}
    print(f"wrote {write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
