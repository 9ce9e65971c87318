"""Every group option and every recipe composes; composition mistakes fail naming the problem."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from agentrl.config import register_configs
from agentrl.config.locate import conf_dir, project_root
from agentrl.config.register import SCHEMAS, recipe_names

GROUPS = ["env", "agent", "reward", "trainer", "model", "inference", "sandbox", "logger", "paths"]
# Options whose schema has a required value with no default.
REQUIRED = {("model", "hf"): ["model.path=/data/some-model"], ("env", "custom"): ["env.bundle=/data/bundle"]}


@pytest.fixture(autouse=True)
def hydra_ctx():
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


def group_options(group: str) -> list[str]:
    return GlobalHydra.instance().config_loader().get_group_options(group)


def validate(cfg) -> dict:
    """Resolve every interpolation (outside hydra's own node) and refuse any missing value."""
    job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    return OmegaConf.to_container(job, resolve=True, throw_on_missing=True)


def all_options() -> list[tuple[str, str]]:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return [(g, o) for g in GROUPS for o in group_options(g)]


def test_every_group_has_options_and_a_schema_for_each():
    for group in GROUPS:
        options = group_options(group)
        assert options, f"group {group} has no options"
        assert sorted(options) == sorted(SCHEMAS[group]), f"group {group}: yaml options vs schemas differ"


@pytest.mark.parametrize(("group", "option"), all_options())
def test_option_composes_and_validates(group: str, option: str):
    cfg = compose("config", overrides=[f"{group}={option}", *REQUIRED.get((group, option), [])],
                  return_hydra_config=True)
    assert cfg.hydra.runtime.choices[group] == option
    container = validate(cfg)
    assert container[group] is not None
    if "_target_" in cfg[group]:
        assert cfg[group]._target_.startswith("agentrl.")


def test_recipes_exist():
    assert {"gridsim_sft", "gridsim_grpo", "arith_co_evolution", "gridsim_miles"} <= set(recipe_names())


@pytest.mark.parametrize("recipe", [r for r in recipe_names() if r != "gridsim_lora_4b"])  # needs model.path: test_recipe_lora_4b
def test_recipe_composes_and_is_the_runtime_choice(recipe: str):
    cfg = compose("config", overrides=[f"+recipe={recipe}"], return_hydra_config=True)
    assert cfg.hydra.runtime.choices["recipe"] == recipe
    assert cfg.task_name == recipe  # every recipe names its task, so its runs land in their own folder
    assert cfg.recipe is None  # the recipe was applied as a config, not added as a string
    validate(cfg)


def test_recipe_overrides_apply_and_cli_wins():
    cfg = compose("config", overrides=["+recipe=arith_co_evolution"], return_hydra_config=True)
    assert cfg.hydra.runtime.choices["env"] == "arith"
    assert cfg.hydra.runtime.choices["agent"] == "co_evolution"
    assert cfg.reward.correct_weight == 1.2 and cfg.reward.incorrect_weight == 0.8
    cfg = compose("config", overrides=["+recipe=gridsim_grpo", "trainer.lr=9e-6", "sandbox=docker"],
                  return_hydra_config=True)
    assert cfg.trainer.lr == 9e-6
    assert cfg.hydra.runtime.choices["sandbox"] == "docker"


def test_misspelled_key_names_its_full_path():
    with pytest.raises(ConfigCompositionException) as err:
        compose("config", overrides=["+recipe=gridsim_grpo", "trainer.warm_start.teacherr=greedy"])
    assert "full_key: trainer.warm_start.teacherr" in str(err.value)
    assert "Did you mean trainer.warm_start.teacher?" in str(err.value)


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        compose("config", overrides=["trainer.samples_per_prompt=eight"])
    cause = str(err.value.__cause__)
    assert "trainer.samples_per_prompt" in cause and "Integer" in cause


def test_unknown_recipe_lists_the_recipes():
    with pytest.raises(ConfigCompositionException) as err:
        compose("config", overrides=["+recipe=gridsim_grpoo"])
    message = str(err.value)
    assert "recipe/gridsim_grpoo" in message
    assert "gridsim_grpo" in message.replace("recipe/gridsim_grpoo", "")


@pytest.mark.parametrize(("trainer", "key", "schema"), [
    ("sft", "trainer.prompts_per_step", "SFTTrainerConfig"),
    ("miles", "trainer.threads", "MilesTrainerConfig"),
])
def test_a_recipe_key_the_chosen_group_lacks_says_the_recipe_chose_another(trainer: str, key: str, schema: str):
    # gridsim_grpo's trainer settings are GRPO's: swapping its trainer group leaves keys the new schema lacks.
    with pytest.raises(ConfigCompositionException) as err:
        compose("config", overrides=["+recipe=gridsim_grpo", f"trainer={trainer}"])
    message = str(err.value)
    assert f"full_key: {key}" in message  # Hydra's own words stay
    assert f"recipe/gridsim_grpo sets {key}, which {schema} (your trainer choice) does not declare" in message
    assert "keep the recipe's own trainer" in message


def test_a_bad_value_in_a_recipe_gets_no_group_hint():
    from agentrl.config.validate import recipe_key_hint

    assert recipe_key_hint("In 'recipe/x': ValidationError raised while composing config:\nValue 'a' ...") is None


def test_unknown_top_level_key_is_refused():
    with pytest.raises(ConfigCompositionException):
        compose("config", overrides=["sead=1"])


@pytest.mark.parametrize(("override", "full_key", "schema"), [
    ("+trainer.lrr=1", "trainer.lrr", "GRPOTrainerConfig"),
    ("+trainer.warm_start.stepz=3", "trainer.warm_start.stepz", "WarmStartConfig"),
    ("++env.promt_style=full", "env.promt_style", "GridSimEnvConfig"),
    ("+sead=1", "sead", "RunConfig"),
])
def test_appended_key_on_a_typed_config_is_refused_naming_it(override: str, full_key: str, schema: str):
    """Hydra's `+`/`++` use OmegaConf's force_add, which bypasses struct mode; the typed check still refuses."""
    with pytest.raises(ConfigCompositionException) as err:
        compose("config", overrides=["+recipe=gridsim_grpo", override])
    assert f"Key '{full_key.rpartition('.')[2]}' not in '{schema}' full_key: {full_key}" in str(err.value)


@pytest.mark.parametrize(("override", "full_key", "near"), [
    ("trainer.lrr=1", "trainer.lrr", "trainer.lr"),
    ("+trainer.lrr=1", "trainer.lrr", "trainer.lr"),
    ("trainer.warm_startt.steps=5", "trainer.warm_startt", "trainer.warm_start"),  # the first key that is wrong
    ("env.promt_style=full", "env.promt_style", "env.prompt_style"),
    ("sead=1", "sead", "seed"),
])
def test_a_mistyped_key_is_refused_with_the_keys_closest_to_it(override: str, full_key: str, near: str):
    """With or without `+`, a typo names the schema's closest keys; Hydra's own advice for a key struct mode refused
    (prefix a `+`) is not given: the `+` would be refused next."""
    with pytest.raises(ConfigCompositionException) as err:
        compose("config", overrides=["+recipe=gridsim_grpo", override])
    message = str(err.value)
    assert f"full_key: {full_key}:" in message and f"Did you mean {near}" in message, message
    assert "To append" not in message


def test_a_key_far_from_every_declared_one_gets_no_guess():
    from agentrl.config.schema import RunConfig
    from agentrl.config.validate import unknown_key_message

    message = unknown_key_message("qqqqqq", RunConfig)
    assert "Did you mean" not in message and "RunConfig's keys: env, agent" in message


def test_appending_to_an_untyped_value_still_works():
    """Keys of plain-dict values (not schemas) stay open: only typed nodes are checked."""
    from agentrl.config.validate import added_keys

    cfg = compose("config", overrides=["+recipe=gridsim_grpo"])
    assert added_keys(cfg) == []
    cfg = compose("config", overrides=["+recipe=gridsim_grpo", "+hydra.job.env_set.FOO=1"],
                  return_hydra_config=True)
    assert cfg.hydra.job.env_set.FOO == "1"


def test_every_recipe_describes_itself():
    for recipe in recipe_names():
        cfg = compose("config", overrides=[f"+recipe={recipe}"])
        assert isinstance(cfg.description, str) and len(cfg.description) > 40, recipe


def test_defaults_are_the_embedded_cpu_stack():
    cfg = compose("config", return_hydra_config=True)
    choices = cfg.hydra.runtime.choices
    assert (choices["env"], choices["trainer"], choices["model"], choices["inference"], choices["sandbox"]) == (
        "gridsim", "grpo", "tiny", "embedded", "local")
    assert cfg.hydra.job.chdir is False
    # Run directories hang off the project's output root, not the working directory.
    assert cfg.hydra.run.dir.startswith(str(project_root() / "outputs" / "runs" / "train"))


def test_hparams_search_space():
    cfg = compose("config", overrides=["+recipe=gridsim_grpo", "hparams_search=gridsim_optuna"],
                  return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    assert set(params) == {"trainer.lr", "trainer.temperature", "trainer.samples_per_prompt"}
    assert cfg.hydra.sweeper.direction == "maximize"


def test_max_turns_has_one_home_in_the_agent_group():
    cfg = compose("config", overrides=["+recipe=gridsim_grpo", "agent.max_turns=3"])
    assert cfg.agent.max_turns == 3 and "max_turns" not in cfg.trainer
    assert compose("config", overrides=["+recipe=gridsim_sft"]).agent.max_turns == 4
    with pytest.raises(ConfigCompositionException, match="max_turns"):  # the old key is refused, by name
        compose("config", overrides=["+recipe=gridsim_grpo", "trainer.max_turns=2"])
