"""Episode traces in MLflow Tracing: one trace per play, a span per role, a span per model turn and per tool call.

The trainer's runner hands finished plays over as `EpisodeTrace` values (`trace_record`: plain data, this
layer knows no agent types); `TraceWriter` logs them on a thread of its own, so a training step never waits on the store, and
`close()` (the run's end) writes what is still queued.

MLflow's tracing API exports through one process-wide tracer that reads the process's tracking URI, while
the tracker writes through its own client: the writer points that URI at the run's store only while it logs
(and puts $MLFLOW_TRACKING_URI back, as `MLflowTracker.log_model` does).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any

from agentrl.tracking.trace_record import EpisodeTrace, TracedTurn

log = logging.getLogger(__name__)

# The text of one message, reply or tool answer kept in a span: a runaway reply must not make a trace of MBs.
MAX_TEXT_CHARS = 20_000

# OpenTelemetry's default trace and span ids come from the global `random`, which a run seeds (`seed`): two runs
# with one seed would write the same trace ids, and the later run would take the earlier one's traces over.
# MLflow's isolated generator (chosen when its tracer is first made, after this import) draws from a private,
# unseeded Random instead. A user's own setting of the variable wins.
os.environ.setdefault("MLFLOW_TRACE_USE_ISOLATED_RANDOM_ID_GENERATOR", "true")


def _clip(text: Any) -> Any:
    if isinstance(text, str) and len(text) > MAX_TEXT_CHARS:
        return text[:MAX_TEXT_CHARS] + f"... [{len(text) - MAX_TEXT_CHARS} more characters]"
    return text


def _message(message: dict[str, Any]) -> dict[str, Any]:
    return {k: _clip(v) for k, v in message.items()}


def _times(trace: EpisodeTrace) -> tuple[int, int]:
    """The play's first and last recorded instants (now, for a play without a model turn)."""
    stamps = [t for r in trace.roles for turn in r.turns for t in (turn.start_ns, turn.end_ns)
              if t] + [t for r in trace.roles for turn in r.turns for c in turn.calls for t in (c.start_ns, c.end_ns)
                       if t]
    now = time.time_ns()
    return (min(stamps), max(stamps)) if stamps else (now, now)


def log_episode(client: Any, trace: EpisodeTrace, *, experiment_id: str, run_id: str | None) -> str:
    """Write one episode as an MLflow trace through `client` (an MlflowClient); returns its trace id."""
    begin, end = _times(trace)
    root = client.start_trace(trace.name, span_type="AGENT", inputs=trace.task, tags=trace.tags,
                              attributes={"failed": trace.failed}, experiment_id=experiment_id,
                              start_time_ns=begin, run_id=run_id)
    trace_id = root.trace_id
    for role in trace.roles:
        first = role.turns[0].start_ns if role.turns and role.turns[0].start_ns else begin
        last = role.turns[-1].end_ns if role.turns and role.turns[-1].end_ns else end
        span = client.start_span(role.role, trace_id=trace_id, parent_id=root.span_id, span_type="AGENT",
                                 inputs=[_message(m) for m in (role.turns[0].request if role.turns else [])],
                                 attributes={"role": role.role}, start_time_ns=first)
        for k, turn in enumerate(role.turns):
            _log_turn(client, trace_id, span.span_id, k, turn)
        client.end_span(trace_id, span.span_id, outputs=role.outcome, attributes={"failure": role.failure},
                        status="ERROR" if role.failure else "OK", end_time_ns=max(last, first))
    client.end_trace(trace_id, outputs=trace.outcome, status="ERROR" if trace.failed else "OK", end_time_ns=end)
    return trace_id


def _log_turn(client: Any, trace_id: str, parent_id: str, k: int, turn: TracedTurn) -> None:
    span = client.start_span(f"turn {k + 1}", trace_id=trace_id, parent_id=parent_id, span_type="CHAT_MODEL",
                             inputs={"messages": [_message(m) for m in turn.request]},
                             attributes={"finish_reason": turn.finish_reason, "invalid": turn.invalid},
                             start_time_ns=turn.start_ns or None)
    for call in turn.calls:
        # A refused call never reached the env: it sits at the end of its turn's reply.
        began = call.start_ns or turn.end_ns or None
        child = client.start_span(call.name or "(unnamed tool)", trace_id=trace_id, parent_id=span.span_id,
                                  span_type="TOOL", inputs=call.arguments if isinstance(call.arguments, dict)
                                  else {"arguments": _clip(call.arguments)},
                                  attributes={"invalid": call.invalid}, start_time_ns=began)
        if call.invalid:
            outputs: dict[str, Any] = {"invalid": call.invalid}
        else:  # a call that ended the episode also carries the env's scores
            outputs = {"answer": _clip(call.answer), **({"scores": call.scores} if call.scores is not None else {})}
        client.end_span(trace_id, child.span_id, outputs=outputs, status="ERROR" if call.invalid else "OK",
                        end_time_ns=call.end_ns or began)
    client.end_span(trace_id, span.span_id, outputs=_message(turn.reply),
                    status="ERROR" if turn.invalid else "OK", end_time_ns=turn.end_ns or None)


class TraceWriter:
    """Logs `EpisodeTrace`s to a run on a background thread; `close()` writes what is queued and stops it."""

    def __init__(self, tracking_uri: str, experiment_id: str, run_id: str | None) -> None:
        self.tracking_uri, self.experiment_id, self.run_id = tracking_uri, experiment_id, run_id
        self._queue: queue.Queue[EpisodeTrace | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="agentrl-traces", daemon=True)
        self.written = 0
        self.failed = 0
        self._thread.start()

    def put(self, trace: EpisodeTrace) -> None:
        """Queue a trace (returns at once)."""
        self._queue.put(trace)

    def close(self) -> None:
        """Write every queued trace, then stop the thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _work(self) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            while True:  # everything queued meanwhile goes in the same pass
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            traces = [t for t in batch if t is not None]
            if traces:
                self._write(traces)

    def _write(self, traces: list[EpisodeTrace]) -> None:
        import mlflow
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri

        saved = os.environ.get("MLFLOW_TRACKING_URI")
        try:
            with _use_tracking_uri(self.tracking_uri):
                client = mlflow.MlflowClient(tracking_uri=self.tracking_uri)
                for trace in traces:
                    try:
                        log_episode(client, trace, experiment_id=self.experiment_id, run_id=self.run_id)
                        self.written += 1
                    except Exception as err:  # noqa: BLE001 - a trace that cannot be written must not end the run
                        self.failed += 1
                        log.warning("episode trace %s not logged: %s: %s", trace.name, type(err).__name__, err)
                # The exporter may log on a thread of its own: done before the URI changes back.
                mlflow.flush_trace_async_logging(terminate=False)
        finally:
            if saved is not None:
                os.environ["MLFLOW_TRACKING_URI"] = saved
