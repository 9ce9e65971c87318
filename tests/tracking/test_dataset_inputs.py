"""A run's MLflow dataset inputs (`run.dataset_ref`) come from what the `Bundle` interface declares: its version,
its data options and `data_source()` (a folder bundle's folder, another bundle's name). Training and `agentrl eval`
both log through it, so one split is one entry (before, eval's entries lacked the data options)."""

from __future__ import annotations

from agentrl.envs.bundles import load_bundle
from agentrl.envs.server.echo import EchoBundle
from agentrl.run import dataset_ref


def test_a_folder_bundle_is_its_folder_and_another_its_name() -> None:
    arith = load_bundle("arith")
    ref = dataset_ref(arith, "train", "train")
    assert (ref.name, ref.context, ref.split) == ("arith", "train", "train")
    assert ref.source == str(arith.folder) and ref.version == arith.version and ref.rows == arith.splits()["train"]
    echo = EchoBundle()
    assert dataset_ref(echo, "eval", "eval").source == "echo"


def test_the_data_options_are_part_of_every_entry() -> None:
    compact, full = load_bundle("gridsim", prompt_style="compact"), load_bundle("gridsim", prompt_style="full")
    ref = dataset_ref(compact, "eval", "eval")
    assert ref.options == (("prompt_style", "compact"),)
    assert ref.digest() != dataset_ref(full, "eval", "eval").digest()  # other prompts: another dataset
