"""`python -m agentrl.trainers.miles.launcher MILES_ARGS...`: one Miles GRPO job (what Miles' train.py does).

The miles-rl 0.0.2 wheel does not ship train.py, so this module drives the wheel's own pieces in the same
order: placement groups -> rollout manager (SGLang engines, router, session server) -> training actors ->
first weight sync -> per step: rollout, train, save, push weights, evaluate.

Differences from train.py, on purpose:
* Ray is joined at RAY_ADDRESS (or started locally) with a runtime environment that carries this
  process's agentrl variables into every worker: the experimental-rollout flag, PYTHONPATH (so Miles can
  import our agent, reward hook and filter), the MLflow run, and the env server's token variable.
* MLflow: Miles' primary tracking always opens a *new* run; agentrl already opened one, so the driver
  opens none and every actor attaches to `--mlflow-run-id` (Miles' secondary mode).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

log = logging.getLogger("agentrl.miles")

# Variables forwarded into Ray workers besides those miles/args.py sets (which arrive in os.environ).
FORWARDED_PREFIXES = ("MILES_", "MLFLOW_", "AGENTRL_", "PYTHONPATH", "HF_", "TRANSFORMERS_", "NCCL_", "CUDA_")


def worker_env(environ: dict[str, str], extra_names: tuple[str, ...] = ()) -> dict[str, str]:
    """The subset of `environ` that Ray workers need (prefix-matched names plus `extra_names`)."""
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED_PREFIXES) or k in extra_names}


def init_ray(token_var: str | None) -> Any:
    """Join RAY_ADDRESS's cluster, or start a local one, with our runtime environment."""
    import ray

    extra = (token_var,) if token_var else ()
    runtime_env = {"env_vars": worker_env(dict(os.environ), extra)}
    address = os.environ.get("RAY_ADDRESS") or None
    ray.init(address=address, runtime_env=runtime_env, ignore_reinit_error=True)
    return ray


def check_cluster_gpus(ray: Any, args: Any) -> None:
    """Fail early, with numbers, when the cluster has fewer GPUs than the placement asks for."""
    need = args.actor_num_nodes * args.actor_num_gpus_per_node
    if not args.colocate:
        need += args.rollout_num_gpus or 0
    have = int(ray.cluster_resources().get("GPU", 0))
    if have < need:
        raise SystemExit(f"agentrl: the Ray cluster has {have} GPU(s); this Miles run needs {need}")


async def train(args: Any) -> None:
    """The training loop (after Miles' parse_args and ray.init)."""
    import ray
    from miles.ray.placement_group import (
        create_placement_groups,
        create_rollout_manager,
        create_training_models,
    )
    from miles.utils.misc import should_run_periodic_action

    pgs = create_placement_groups(args)
    rollout_manager, per_epoch = create_rollout_manager(args, pgs["rollout"])
    actor, critic = await create_training_models(args, pgs, rollout_manager)
    if critic is not None:
        raise SystemExit("agentrl: the critic path is not wired in this launcher (GRPO needs none)")

    async def push_weights() -> None:
        # SGLang must serve the trained weights before the next rollouts (the first push loads them).
        if args.offload_rollout:
            await asyncio.to_thread(ray.get, rollout_manager.onload_weights.remote())
        await actor.update_weights()
        if args.offload_rollout:
            await asyncio.to_thread(ray.get, rollout_manager.onload_kv.remote())

    async def evaluate(rollout_id: int) -> None:
        await asyncio.to_thread(ray.get, rollout_manager.eval.remote(rollout_id))

    await push_weights()
    start = args.start_rollout_id
    if args.eval_interval is not None and start == 0 and not args.skip_eval_before_train:
        await evaluate(0)
    for rollout_id in range(start, args.num_rollout):
        data = await asyncio.to_thread(ray.get, rollout_manager.generate.remote(rollout_id))
        if args.offload_rollout:
            await asyncio.to_thread(ray.get, rollout_manager.offload.remote())
        await actor.train(rollout_id, data)
        if should_run_periodic_action(rollout_id, args.save_interval, per_epoch, args.num_rollout):
            await actor.save_model(rollout_id, force_sync=rollout_id == args.num_rollout - 1)
            await asyncio.to_thread(ray.get, rollout_manager.save.remote(rollout_id))
        if args.offload_train:
            await actor.offload()
        else:
            await actor.clear_memory()
        await push_weights()
        if should_run_periodic_action(rollout_id, args.eval_interval, per_epoch, args.num_rollout):
            await evaluate(rollout_id)
    await asyncio.to_thread(ray.get, rollout_manager.dispose.remote())


def main(argv: list[str] | None = None) -> int:
    """Parse Miles' arguments (sys.argv), join Ray, train."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if os.environ.get("MILES_EXPERIMENTAL_ROLLOUT_REFACTOR") != "1":
        # Set before Miles is imported: it decides which arguments and rollout path exist.
        os.environ["MILES_EXPERIMENTAL_ROLLOUT_REFACTOR"] = "1"
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    from miles.utils.arguments import parse_args

    args = parse_args()
    run_id = args.mlflow_run_id or os.environ.get("MLFLOW_RUN_ID")
    if args.use_mlflow and not run_id:
        raise SystemExit("agentrl: --use-mlflow without --mlflow-run-id: agentrl opens the run, Miles attaches")
    token_var = os.environ.get("AGENTRL_ENV_TOKEN_VAR")
    ray = init_ray(token_var)
    check_cluster_gpus(ray, args)
    try:
        asyncio.run(train(args))
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
