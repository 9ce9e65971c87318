"""The processes a trainer runs beside itself: the inference engine, its session server and the env server.

All three run in this process on loopback ports (threads), except that an engine with a process of its own
(`inference.process=true`) runs its session server there too, and `env.server.process=true` serves the env from a
child of its own; `RolloutServices.close()` stops them in reverse
order. A role that plays its own model folder (`policies.py`) gets its own engine and session server
beside them (on a free port); the runner routes that role's sessions there. Nothing here knows about losses or optimizers.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.config.schema import RunConfig
from agentrl.config.trainer import DependencyWatchConfig, TrainerConfig
from agentrl.play.dependency_breaker import ENGINE_FAILURES, ENV_FAILURES, Breaker, Dependency
from agentrl.play.failure_notes import FailureNotes
from agentrl.play.policies import MAIN, Policy, plan_policies, routing, untrained_roles
from agentrl.play.rollout import RolloutRunner

log = logging.getLogger(__name__)


def agent_for(plan_agent: Any) -> Any:
    """The plan's agent; it must offer `play(sessions, row, *, request_kwargs)`."""
    if not callable(getattr(plan_agent, "play", None)):
        raise TypeError(f"the agent {type(plan_agent).__name__} has no play(); the built-in trainers need one")
    return plan_agent


@dataclass
class RolloutServices:
    """A running engine + session server + env server, and the runner that plays rows through them."""

    engine: Any
    session_server: Any
    env_url: str
    runner: RolloutRunner
    env_settings: dict[str, Any] = field(default_factory=dict)
    _stops: list[Any] = field(default_factory=list)
    policy_engines: dict[str, Any] = field(default_factory=dict)  # policy name -> its engine (main's included)
    # Wall seconds `start_services` took: the engines' start (a vLLM server's ~90 s) and the servers beside them.
    start_s: float = 0.0

    def close(self) -> None:
        for stop in reversed(self._stops):
            try:
                stop()
            except Exception:  # noqa: BLE001 - closing the rest matters more than one failure
                log.exception("stopping a rollout service failed")
        self._stops.clear()


def dependency_breaker(t: TrainerConfig, env_url: str, engine_url: str) -> Breaker | None:
    """The circuit breaker on the env server and the engine (`trainer.dependency_grace_s`, ...), for a trainer
    whose settings watch their dependencies (grpo, trl); None otherwise (sft: its evaluations just score what
    they get)."""
    if not isinstance(t, DependencyWatchConfig):
        return None
    deps = [Dependency("env server", env_url, ENV_FAILURES), Dependency("engine (its session server)", engine_url, ENGINE_FAILURES)]
    return Breaker(deps, grace_s=t.dependency_grace_s, max_failures=t.max_dependency_failures,
                   on_loss=t.on_dependency_loss, notes=FailureNotes(t.warn_failure_share))


def serve_sessions(engine: Any, **options: Any) -> Any:
    """A started session server over `engine` (`start_session_server`'s keywords): in the engine's own process
    when it has one (`ProcessEngine.serve_sessions`), else on a thread here."""
    from agentrl.inference.sessions.server import start_session_server

    # Optional, so read off the engine itself: `inference=embedded` builds an `EmbeddedEngine` or a `ProcessEngine`
    # (`inference.process`) from one `_target_`, so this is no class capability of the `Engine` protocol.
    if callable(getattr(engine, "serve_sessions", None)):
        return engine.serve_sessions(start_session_server, **options)
    return start_session_server(engine, **options)


def serve_env(bundle: Any, server: Any, *, sandbox: dict[str, Any]) -> tuple[str, Any]:
    """Serve `bundle` for this run with `server`'s settings (`env.server`): on a thread here, or in a child
    process of its own (`env.server.process`). Returns its URL and the call that stops it."""
    options = {**server.app_options(), "sandbox": sandbox}
    if server.process:
        from agentrl.envs.server.process import EnvServerProcess

        child = EnvServerProcess(bundle.spec(), host=server.host, port=server.port, app_options=options)
        return child.base_url, child.stop
    from agentrl.envs.server import build_app, start_server_in_thread

    return start_server_in_thread(build_app(bundle, **options), server.host, server.port)


def start_services(plan: Any, model_path: str, policies: Sequence[Policy] | None = None) -> RolloutServices:
    """Start the engine on `model_path` (the shared policy, `main`), a session server over it, and the env server
    (unless env.server.url). Every other policy in `policies` that is a model folder gets its own engine (on
    `policy.path`) and session server. `policies` None: the plan's own (`agent.roles.<i>.model`), so that every
    play of a run (SFT evals and warm-start evals too) puts each role on the model training gives it.

    Everything comes from the plan: its engine factory, its bundle, agent and reward, and its typed settings.
    """
    started = time.monotonic()
    settings: RunConfig = plan.settings
    if policies is None:
        policies = plan_policies(settings.agent.role_list())
    server, inference = settings.env.server, settings.inference
    session_options = {"default_max_tokens": settings.agent.max_response_tokens,
                       "tool_format": settings.model.tool_format, "max_body_bytes": inference.max_body_bytes}
    stops: list[Any] = []
    try:
        env_url = server.url
        if not env_url:
            env_url, stop_env = serve_env(plan.bundle, server, sandbox=dataclasses.asdict(settings.sandbox))
            stops.append(stop_env)
        engine = plan.engine_factory(model_path)
        stops.append(engine.close)
        session_server = serve_sessions(engine, host=inference.host, port=inference.port, **session_options)
        stops.append(session_server.stop)
        engines, servers = {MAIN: engine}, {}
        for policy in policies:
            if policy.external or policy.name == MAIN:
                continue
            engines[policy.name] = plan.engine_factory(policy.path)
            stops.append(engines[policy.name].close)
            own = serve_sessions(engines[policy.name], host=inference.host, port=0, **session_options)
            stops.append(own.stop)
            servers[policy.name] = own.base_url
        frozen = [r.name for r in settings.agent.role_list() if r.frozen] + untrained_roles(policies)
        runner = RolloutRunner(agent_for(plan.agent), session_server, reward=plan.reward,
                               frozen_roles=frozen, **routing(policies, servers))
        runner.breaker = dependency_breaker(settings.trainer, env_url, session_server.base_url)
        return RolloutServices(engine, session_server, env_url, runner, dataclasses.asdict(server), stops, engines,
                               start_s=time.monotonic() - started)
    except BaseException:
        for stop in reversed(stops):
            stop()
        raise
