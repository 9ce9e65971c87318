"""What the agent reads: system prompt, user prompt (`full` or `compact`) and the tool schema.

Only a record's inputs are rendered here; the references (optimum, greedy) never reach a prompt.
"""

from __future__ import annotations

from typing import Any

PROMPT_STYLES = ("full", "compact")

SYSTEM_FULL = (
    "You operate a grid-scale battery in ERCOT's day-ahead market. You see tomorrow's 24 hourly prices and "
    "submit one schedule for the whole day with the submit_schedule tool. Earn as much as you can: buy energy "
    "when it is cheap and sell it when it is expensive, remembering that some energy is lost on every round trip."
)
SYSTEM_COMPACT = (
    "Battery arbitrage. D=hours of storage, eta=round-trip efficiency %, P=MW; then 24 hourly prices $/MWh. "
    "Call submit_schedule with 24 values: 1 charge, -1 sell, 0 idle. Storage starts at 0 and must stay in 0..D."
)

TOOL_NAME = "submit_schedule"
SUBMIT_SCHEDULE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Submit the battery's plan for the whole operating day: exactly 24 integers, one per hour in order "
            "(first = hour ending 01:00, last = hour ending 24:00). 1 = charge (buy a full hour at full power), "
            "-1 = sell (discharge a full hour at full power), 0 = idle. The battery starts the day empty and its "
            "charge must stay between empty and full every hour. A feasible schedule ends the episode and is "
            "graded; an infeasible one is returned with the problems found, while turns remain."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "schedule": {
                    "type": "array",
                    "description": "24 integers, each -1 (sell), 0 (idle) or 1 (charge), hour ending 01..24.",
                    "items": {"type": "integer", "enum": [-1, 0, 1]},
                    "minItems": 24,
                    "maxItems": 24,
                }
            },
            "required": ["schedule"],
            "additionalProperties": False,
        },
    },
}


# The compact style's tool: the same name and argument schema, without the prose the compact system prompt
# already carries (the full tool text is ~170 of a compact transcript's ~250 tokens for the tiny model).
SUBMIT_SCHEDULE_TOOL_COMPACT: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Submit 24 values, one per hour.",
        "parameters": {
            "type": "object",
            "properties": {"schedule": {"type": "array", "items": {"type": "integer", "enum": [-1, 0, 1]}}},
            "required": ["schedule"],
        },
    },
}


def tool_schema(style: str) -> dict[str, Any]:
    """submit_schedule's schema as the agent sees it in `style`."""
    return SUBMIT_SCHEDULE_TOOL_COMPACT if style == "compact" else SUBMIT_SCHEDULE_TOOL


def system_prompt(style: str) -> str:
    return SYSTEM_COMPACT if style == "compact" else SYSTEM_FULL


def user_prompt(record: dict[str, Any], style: str) -> str:
    """The day as the agent sees it, from a task record's public inputs."""
    b = record["battery"]
    p, d, eta = b["power_mw"], b["duration_h"], int(round(b["efficiency"] * 100))
    prices = record["prices"]
    if style == "compact":
        return f"D={d} eta={eta} P={p} | " + " ".join(str(int(round(x))) for x in prices)
    delivered = f"{p * eta / 100:.1f}"
    rows = []
    for start in range(0, 24, 4):
        rows.append("  ".join(f"HE{h + 1:02d} {prices[h]:8.2f}" for h in range(start, start + 4)))
    hours = "hour" if d == 1 else "hours"
    return (
        f"Battery: a {p} MW / {p * d} MWh battery at settlement point {record['settlement_point']}\n"
        f"- Power: {p} MW. Energy: {p * d} MWh, so a full charge takes {d} {hours} at full power.\n"
        f"- Round-trip efficiency: {eta}%: each hour of charging buys {p} MWh; each hour of selling delivers "
        f"{delivered} MWh.\n"
        f"- The battery starts the day empty (0 of {d} {hours} stored). Energy still stored at the end of the day "
        "is worth nothing.\n\n"
        f"Day-ahead settlement point prices for {record['date']} ({record['weekday']}), $/MWh, hour ending (HE) "
        "in Central time:\n" + "\n".join(rows) + "\n\n"
        f"Rules: for each hour give 1 (charge for the whole hour at {p} MW), -1 (sell for the whole hour at "
        f"{p} MW) or 0 (idle).\n"
        f"Charging adds one hour of storage, selling removes one; storage must stay between 0 and {d} after every "
        "hour, so you\ncannot sell while empty or charge while full. Cash flow of an hour: charging costs price x "
        f"{p}; selling earns\nprice x {delivered} (a negative price reverses both: you are paid to charge and pay "
        "to sell).\n\n"
        'Call submit_schedule once with all 24 values, e.g. {"schedule": [0, 0, 1, ...]} (24 entries). If it is '
        "infeasible\nyou will be told why and may resubmit; you have 4 submissions in all."
    )
