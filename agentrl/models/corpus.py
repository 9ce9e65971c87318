"""Text the tiny model's tokenizer is trained on, generated in code (nothing is downloaded).

Two sources: a built-in synthetic corpus (battery-schedule and arithmetic chats with tool calls, tool
results as JSON, numbers, English sentences), and the chats of the shipped bundles (GridSim in both prompt
styles, arith), frozen in `tokenizer_chats.jsonl.gz` beside this module. Everything is rendered with the tiny
model's own chat template, so the template's fixed text is frequent enough to become a few tokens.
"""

from __future__ import annotations

import gzip
import json
import random
from typing import Any

# The corpus never depends on the model's seed: every seed shares one tokenizer.
CORPUS_SEED = 20240101

WORDS = (
    "the a an of to in for on with at by from and or but not no yes is are was be been has have had do does "
    "did can could will would should may might must this that these those it its they them their we our you "
    "your he she his her one two three four five six seven eight nine ten hundred thousand first last next "
    "each every all some many more most less least few other same different new old good bad high low cheap "
    "expensive price prices hour hours day days night morning noon evening week month year time today "
    "tomorrow battery energy power storage charge charging sell selling buy buying idle market grid load "
    "demand supply solar wind peak trough profit cost loss revenue cash flow efficiency round trip full empty "
    "level plan schedule submit tool call function result answer question number numbers sum total difference "
    "product quotient add subtract multiply divide equals value values list integer integers problem problems "
    "error feasible infeasible accepted rejected reward score grade turn turns episode task model agent user "
    "assistant system think step because so then when while if else until after before between above below "
    "max min average mean median spread up down left right start end begin finish keep stay give take make "
    "find work solve check count compute return read write show tell know see look get put set use try"
).split()

SYSTEMS = (
    "You are a helpful assistant.",
    "You operate a battery. Buy cheap, sell expensive, and submit one schedule with the tool.",
    "Battery arbitrage. D=hours of storage, eta=round-trip efficiency %, P=MW; then 24 hourly prices $/MWh.",
    "Solve the arithmetic problem. Give the final answer with the submit_answer tool.",
    "You are a careful assistant that calls tools when they help.",
)

SCHEDULE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit_schedule",
        "description": "Submit the battery's plan for the day: 24 integers, 1 = charge, -1 = sell, 0 = idle.",
        "parameters": {
            "type": "object",
            "properties": {"schedule": {"type": "array", "items": {"type": "integer", "enum": [-1, 0, 1]},
                                        "minItems": 24, "maxItems": 24}},
            "required": ["schedule"],
        },
    },
}
ANSWER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit_answer",
        "description": "Submit the final answer to the problem.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "number"}}, "required": ["answer"]},
    },
}


def _sentence(rng: random.Random, lo: int = 4, hi: int = 14) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 999)))
    return " ".join(words).capitalize() + rng.choice(".?!.")


def _prices(rng: random.Random) -> list[float]:
    base = rng.uniform(10, 60)
    out = []
    for h in range(24):
        shape = 1.0 + 0.4 * rng.random() + (0.8 if 17 <= h <= 21 else 0.0) - (0.4 if 10 <= h <= 15 else 0.0)
        p = base * shape + rng.gauss(0, 4)
        if rng.random() < 0.03:
            p = rng.choice((-1, 8)) * rng.uniform(5, 60)
        out.append(round(p, 2))
    return out


def _schedule(rng: random.Random, d: int) -> list[int]:
    soc, out = 0, []
    for _ in range(24):
        a = rng.choice((-1, 0, 0, 1))
        a = 0 if not 0 <= soc + a <= d else a
        soc += a
        out.append(a)
    return out


def _call(name: str, arguments: dict[str, Any], n: int) -> dict[str, Any]:
    return {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _battery_chat(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    d, eta, p = rng.choice((1, 2, 4)), rng.randint(80, 95), rng.choice((10, 25, 50, 100, 150, 200))
    prices = _prices(rng)
    if rng.random() < 0.6:
        user = f"D={d} eta={eta} P={p} | " + " ".join(str(int(round(x))) for x in prices)
    else:
        rows = ["  ".join(f"HE{h + 1:02d} {prices[h]:8.2f}" for h in range(s, s + 4)) for s in range(0, 24, 4)]
        user = (f"Battery: a {p} MW / {p * d} MWh battery, round-trip efficiency {eta}%.\n"
                "Prices, $/MWh, hour ending (HE):\n" + "\n".join(rows))
    msgs: list[dict[str, Any]] = [{"role": "system", "content": rng.choice(SYSTEMS[1:3])},
                                  {"role": "user", "content": user}]
    for turn in range(rng.randint(1, 3)):
        msgs.append({"role": "assistant", "content": "" if rng.random() < 0.8 else _sentence(rng),
                     "tool_calls": [_call("submit_schedule", {"schedule": _schedule(rng, d)}, turn)]})
        if rng.random() < 0.5:
            result = {"accepted": True, "feasible": True, "profit_usd": round(rng.uniform(-500, 9000), 2),
                      "reward": round(rng.random(), 3), "done": True}
        else:
            hour = rng.randint(1, 24)
            result = {"accepted": False, "feasible": False,
                      "problems": [f"HE{hour:02d}: sell, but the battery is empty (0/{d} hours stored)"],
                      "problem_count": 1, "submissions_left": 3 - turn, "done": False}
        msgs.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": json.dumps(result)})
        if result["done"]:
            break
    return msgs, [SCHEDULE_TOOL]


def _arith_chat(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    a, b = rng.randint(-99, 999), rng.randint(1, 999)
    op = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEMS[3]},
                                  {"role": "user", "content": f"What is {a} {op} {b}?"}]
    if rng.random() < 0.5:
        msgs.append({"role": "assistant", "content": "", "tool_calls": [_call("submit_answer", {"answer": value}, 0)]})
        msgs.append({"role": "tool", "tool_call_id": "call_0", "content": json.dumps({"correct": True})})
        msgs.append({"role": "assistant", "content": f"The answer is {value}."})
        return msgs, [ANSWER_TOOL]
    msgs.append({"role": "assistant", "content": f"{a} {op} {b} = {value}. The answer is {value}."})
    return msgs, []


def _plain_text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        return " ".join(_sentence(rng) for _ in range(rng.randint(1, 5)))
    if kind < 0.7:
        return " ".join(str(rng.choice((rng.randint(-300, 300), rng.randint(0, 99), round(rng.uniform(-50, 500), 2))))
                        for _ in range(rng.randint(5, 30)))
    obj = {rng.choice(WORDS): rng.choice((rng.randint(-999, 9999), rng.choice(WORDS), rng.random() < 0.5,
                                          [rng.randint(-1, 1) for _ in range(rng.randint(1, 8))]))
           for _ in range(rng.randint(1, 6))}
    return json.dumps(obj)


CHATS_FILE = "tokenizer_chats.jsonl.gz"


def bundle_chats() -> dict[str, list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]]:
    """The shipped bundles' chats by source (`gridsim:compact`, ...), in corpus order: (messages, tools) each.

    Read from a file frozen beside this module (made by `agentrl.envs.corpus`), so that making a model never
    imports an env bundle, and the tokenizer changes only when that file is regenerated on purpose.
    """
    from importlib.resources import files

    raw = files("agentrl.models").joinpath(CHATS_FILE).read_bytes()
    out: dict[str, list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]] = {}
    for line in gzip.decompress(raw).decode("utf-8").splitlines():
        record = json.loads(line)
        out.setdefault(record["source"], []).append((record["messages"], record["tools"]))
    return out


def corpus(synthetic_chats: int = 2000, use_bundles: bool = True) -> tuple[list[str], list[str]]:
    """The training texts and the names of the sources that contributed (e.g. `gridsim:compact`).

    Deterministic for a given agentrl checkout: fixed seed, fixed task counts, no time limits.
    """
    from transformers.utils.chat_template_utils import render_jinja_template

    template = chat_template()
    rng = random.Random(CORPUS_SEED)
    texts: list[str] = []
    sources = ["synthetic"]

    def render(msgs: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        rendered, _ = render_jinja_template([msgs], tools=tools or None, chat_template=template)
        return rendered[0]

    for _ in range(synthetic_chats):
        msgs, tools = (_battery_chat if rng.random() < 0.6 else _arith_chat)(rng)
        texts.append(render(msgs, tools))
        texts.append(_plain_text(rng))
    if use_bundles:
        for label, chats in bundle_chats().items():
            texts.extend(render(m, t) for m, t in chats)
            sources.append(label)
    return texts, sources


def chat_template() -> str:
    """The tiny model's Jinja chat template (shipped as `agentrl/models/chat_template.jinja`)."""
    from importlib.resources import files

    return files("agentrl.models").joinpath("chat_template.jinja").read_text(encoding="utf-8")
