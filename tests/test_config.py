from pathlib import Path

import re

import pytest

from ponder.config import (
    ConfigError,
    EnvConfig,
    ModelConfig,
    PipelineRecipe,
    Recipe,
    RolloutConfig,
    SamplingConfig,
    from_dict,
    load_recipe,
    to_dict,
)
from ponder.envs.search_qa import RetrieverConfig, SearchQAOptions
from ponder.envs.synthetic import TaskGenConfig

RECIPES = Path(__file__).resolve().parents[1] / "recipes"

RECIPE = """\
model:
  name: tiny
  device: cpu
env:
  max_turns: 3
  options:
    taskgen:
      seed: 7
      n_people: 20
    retriever:
      kind: bm25
      url: null
rollout:
  batch_size: 8
  group_size: 4
  sampling:
    temperature: 0.7
    top_p: 0.9
reward:
  terms:
    search_cost: -0.1
"""
# The same recipe as written before search-QA's keys moved into its own options.
OLD_RECIPE = """\
env:
  max_turns: 3
  taskgen:
    seed: 7
retriever:
  kind: bm25
reward:
  search_cost: -0.1
"""


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_loads_a_yaml_recipe(tmp_path):
    recipe = load_recipe(write(tmp_path, RECIPE))
    assert recipe.model == ModelConfig(name="tiny", dtype="auto", device="cpu")
    assert recipe.env.max_turns == 3
    options = SearchQAOptions.from_recipe(recipe)
    assert options.taskgen == TaskGenConfig(seed=7, n_people=20)
    assert recipe.rollout == RolloutConfig(
        batch_size=8, group_size=4, seed=0, sampling=SamplingConfig(temperature=0.7, top_p=0.9)
    )
    assert options.retriever == RetrieverConfig(kind="bm25", url=None)
    assert options.max_obs_tokens == 256  # untouched options keep their defaults
    assert recipe.reward.terms == {"search_cost": -0.1}
    assert recipe.eval.episodes == 32


def test_no_path_gives_defaults():
    assert load_recipe(None) == Recipe()


def test_empty_file_gives_defaults(tmp_path):
    assert load_recipe(write(tmp_path, "")) == Recipe()


def test_unknown_nested_key_names_file_and_dotted_key(tmp_path):
    path = write(tmp_path, "rollout:\n  sampling:\n    temprature: 0.5\n")
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    message = str(info.value)
    assert str(path) in message
    assert "'rollout.sampling.temprature'" in message
    assert "temperature" in message  # the valid keys are listed


def test_unknown_top_level_key(tmp_path):
    path = write(tmp_path, "modle:\n  name: tiny\n")
    with pytest.raises(ConfigError, match=r"unknown key 'modle'"):
        load_recipe(path)


def test_wrong_type_names_the_key(tmp_path):
    path = write(tmp_path, 'rollout:\n  batch_size: "big"\n')
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    message = str(info.value)
    assert str(path) in message
    assert "'rollout.batch_size'" in message
    assert "int" in message and "'big'" in message


@pytest.mark.parametrize(
    "text, key",
    [
        ("rollout:\n  batch_size: 2.5\n", "rollout.batch_size"),  # float for int
        ("rollout:\n  batch_size: true\n", "rollout.batch_size"),  # bool is not an int here
        ("rollout:\n  sampling:\n    temperature: true\n", "rollout.sampling.temperature"),
        ("model:\n  name: 123\n", "model.name"),
        ("rollout: 5\n", "rollout"),  # a section must be a mapping
    ],
)
def test_other_wrong_types_are_rejected(tmp_path, text, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_recipe(write(tmp_path, text))


def test_int_is_accepted_for_float_fields(tmp_path):
    recipe = load_recipe(write(tmp_path, "rollout:\n  sampling:\n    temperature: 1\n"))
    assert recipe.rollout.sampling.temperature == 1.0
    assert type(recipe.rollout.sampling.temperature) is float


def test_optional_field_takes_a_string_or_null(tmp_path):
    assert load_recipe(write(tmp_path, "rollout:\n  vllm_url: http://x:8000\n")).rollout.vllm_url == "http://x:8000"
    assert load_recipe(write(tmp_path, "rollout:\n  vllm_url: null\n")).rollout.vllm_url is None
    options = {"retriever": {"url": "http://x:8000"}}
    assert SearchQAOptions.from_options(options).retriever.url == "http://x:8000"


def test_overrides_are_applied_and_typed(tmp_path):
    recipe = load_recipe(
        write(tmp_path, RECIPE),
        [
            "rollout.sampling.temperature=0.5",
            "rollout.batch_size=2",
            "model.name=smollm2-135m",
            "env.options.taskgen.seed=3",
        ],
    )
    assert recipe.rollout.sampling.temperature == 0.5
    assert recipe.rollout.batch_size == 2
    assert type(recipe.rollout.batch_size) is int
    assert recipe.model.name == "smollm2-135m"
    assert SearchQAOptions.from_recipe(recipe).taskgen == TaskGenConfig(seed=3, n_people=20)
    assert recipe.rollout.sampling.top_p == 0.9  # the file's other values stay


def test_override_int_for_float_field_becomes_float():
    recipe = load_recipe(None, ["rollout.sampling.temperature=1"])
    assert recipe.rollout.sampling.temperature == 1.0
    assert type(recipe.rollout.sampling.temperature) is float


def test_override_of_unknown_key_fails(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'rollout\.sampling\.temprature'"):
        load_recipe(write(tmp_path, RECIPE), ["rollout.sampling.temprature=0.5"])


def test_override_with_wrong_type_fails():
    with pytest.raises(ConfigError, match=r"'rollout\.group_size' expects int, got 'many'"):
        load_recipe(None, ["rollout.group_size=many"])


def test_override_without_equals_fails():
    with pytest.raises(ConfigError, match="not key=value"):
        load_recipe(None, ["rollout.batch_size"])


def test_override_through_a_scalar_fails(tmp_path):
    path = write(tmp_path, "rollout:\n  batch_size: 4\n")
    with pytest.raises(ConfigError, match="rollout.batch_size"):
        load_recipe(path, ["rollout.batch_size.x=1"])


def test_invalid_yaml_names_the_file(tmp_path):
    path = write(tmp_path, "rollout:\n  batch_size: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_recipe(path)
    assert str(path) in str(info.value)


def test_missing_file_fails(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="cannot read recipe") as info:
        load_recipe(path)
    assert str(path) in str(info.value)


def test_top_level_list_fails_naming_the_file(tmp_path):
    path = write(tmp_path, "- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping") as info:
        load_recipe(path)
    assert str(path) in str(info.value)


def test_to_dict_round_trips():
    recipe = Recipe(env=EnvConfig(max_turns=2, options={"taskgen": {"seed": 5}}))
    recipe.rollout.sampling.temperature = 0.25
    assert from_dict(Recipe, to_dict(recipe)) == recipe


def test_empty_section_loads_as_defaults(tmp_path):
    # `rollout:` with every child commented out is null in YAML
    recipe = load_recipe(write(tmp_path, "rollout:\n  # batch_size: 4\n"))
    assert recipe.rollout == RolloutConfig()


def test_override_into_an_empty_section(tmp_path):
    recipe = load_recipe(write(tmp_path, "rollout:\n  # batch_size: 4\n"), ["rollout.seed=3"])
    assert recipe.rollout.seed == 3


def test_exponent_notation_for_float_fields(tmp_path):
    assert load_recipe(None, ["rollout.sampling.temperature=1e-3"]).rollout.sampling.temperature == 0.001
    path = write(tmp_path, "rollout:\n  sampling:\n    temperature: 5e-1\n")
    assert load_recipe(path).rollout.sampling.temperature == 0.5


def test_top_level_list_with_override_fails_as_config_error(tmp_path):
    with pytest.raises(ConfigError):
        load_recipe(write(tmp_path, "- a\n- b\n"), ["rollout.seed=1"])


def test_non_utf8_recipe_fails_as_config_error(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("model:\n  name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert str(path) in str(info.value)


def _recipe_files() -> list:
    files = sorted(RECIPES.glob("*.yaml")) + sorted(RECIPES.glob("*.yml")) if RECIPES.is_dir() else []
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason="recipes/ holds no YAML files yet"))]
    return [pytest.param(path, id=path.name) for path in files]


@pytest.mark.parametrize("path", _recipe_files())
def test_every_shipped_recipe_loads(path):
    # pipeline recipes (`ponder pipeline run`) add the pipeline's sections to a Recipe
    cls = PipelineRecipe if path.name.startswith("pipeline_") else Recipe
    recipe = load_recipe(path, cls=cls)
    assert isinstance(recipe, cls)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.save_every=0", "key 'train.save_every' must be >= 1, got 0"),
        ("rollout.group_size=0", "key 'rollout.group_size' must be >= 1, got 0"),
        ("train.tasks_per_step=0", "key 'train.tasks_per_step' must be >= 1, got 0"),
        ("rollout.batch_size=0", "key 'rollout.batch_size' must be >= 1, got 0"),
        ("rollout.sampling.temperature=-0.5", "key 'rollout.sampling.temperature' must be >= 0, got -0.5"),
        ("rollout.sampling.top_p=0", "key 'rollout.sampling.top_p' must be in (0, 1], got 0.0"),
        ("rollout.sampling.max_total_tokens=0", "key 'rollout.sampling.max_total_tokens' must be >= 1, got 0"),
        ("env.max_turns=0", "key 'env.max_turns' must be >= 1, got 0"),
        ("train.steps=-3", "key 'train.steps' must be >= 0, got -3"),
        ("algo.gamma=1.5", "key 'algo.gamma' must be in [0, 1], got 1.5"),
    ],
)
def test_values_out_of_range_fail_at_load_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_recipe(None, [override])


def test_pipeline_ranges_are_checked_too():
    from ponder.config import PipelineRecipe

    with pytest.raises(ConfigError, match=re.escape("key 'selection.target_size' must be >= 0, got -1")):
        load_recipe(None, ["selection.target_size=-1"], cls=PipelineRecipe)


def test_duplicate_key_names_the_file_the_line_and_the_key(tmp_path):
    path = write(tmp_path, "rollout:\n  batch_size: 4\n  group_size: 2\n  batch_size: 8\n")
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert str(info.value) == f"{path}:4: duplicate key 'batch_size' (first at line 2)"


def test_duplicate_section_is_refused_even_when_the_first_is_empty(tmp_path):
    # recipes/code.yaml had `model:` twice, the first empty: PyYAML kept the last, silently
    path = write(tmp_path, "# header\nmodel:\n# the header again\nenv:\n  max_turns: 2\nmodel:\n  name: tiny\n")
    with pytest.raises(ConfigError, match=r"recipe\.yaml:6: duplicate key 'model' \(first at line 2\)$"):
        load_recipe(path)


def test_duplicate_key_in_an_override_value_is_refused():
    with pytest.raises(ConfigError, match=r"duplicate key 'a'"):
        load_recipe(None, ["env.options={a: 1, b: 2, a: 3}"])


def test_a_merge_key_may_be_set_again(tmp_path):
    text = "env:\n  options:\n    base: &b {x: 1, y: 2}\n    derived:\n      <<: *b\n      x: 3\n"
    options = load_recipe(write(tmp_path, text)).env.options
    assert options["derived"] == {"x": 3, "y": 2}


def test_same_key_in_two_mappings_is_no_duplicate(tmp_path):
    recipe = load_recipe(write(tmp_path, "rollout:\n  seed: 1\ntrain:\n  seed: 2\n"))
    assert (recipe.rollout.seed, recipe.train.seed) == (1, 2)


def test_duplicate_key_is_one_line_and_exit_code_2_from_the_cli(tmp_path, capsys):
    from ponder.cli import main

    path = write(tmp_path, "model:\n  name: tiny\n  name: tiny\n")
    code = main(["eval", "--recipe", str(path), "--out", str(tmp_path / "never")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"ponder eval: error: {path}:3: duplicate key 'name' (first at line 2)"]
    assert not (tmp_path / "never").exists()


def test_unknown_key_is_one_line_listing_every_valid_key_of_its_section(tmp_path):
    path = write(tmp_path, "optim:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        f"{path}: unknown key 'optim.learning_rate' "
        "(valid: lr, max_grad_norm, schedule, warmup_steps, weight_decay)"
    )


MOVED_KEYS = [
    ("reward.em=2.0", "reward.em", "reward.terms.em"),
    ("reward.f1=0.5", "reward.f1", "reward.terms.f1"),
    ("reward.format=0.5", "reward.format", "reward.terms.format"),
    ("reward.search_cost=-0.1", "reward.search_cost", "reward.terms.search_cost"),
    ("env.taskgen.n_people=20", "env.taskgen", "env.options.taskgen"),
    ("env.corpus=c.jsonl", "env.corpus", "env.options.corpus"),
    ("env.tasks=t.jsonl", "env.tasks", "env.options.tasks"),
    ("env.max_obs_tokens=32", "env.max_obs_tokens", "env.options.max_obs_tokens"),
    ("env.max_invalid_actions=1", "env.max_invalid_actions", "env.options.max_invalid_actions"),
    ("retriever.topk=1", "retriever", "env.options.retriever"),
]


@pytest.mark.parametrize("override, old, new", MOVED_KEYS, ids=[m[1] for m in MOVED_KEYS])
def test_a_moved_key_is_one_line_naming_its_new_key(override, old, new):
    """Search-QA's keys left the core sections: an old spelling is refused, never read another way."""
    with pytest.raises(ConfigError) as info:
        load_recipe(None, [override])
    message = str(info.value)
    assert f"key '{old}' moved to '{new}'" in message and "\n" not in message
    with pytest.raises(ConfigError, match=re.escape(f"moved to '{new}'")):
        load_recipe(None, [override], cls=PipelineRecipe)  # a PipelineRecipe is a Recipe: the same keys moved
    load_recipe(None, [override.replace(old, new, 1)])  # the new key loads


def test_an_old_recipe_file_names_the_file_and_the_new_key(tmp_path):
    path = write(tmp_path, OLD_RECIPE)
    with pytest.raises(ConfigError, match=re.escape(f"{path}: key 'env.taskgen' moved to 'env.options.taskgen'")):
        load_recipe(path)


def test_search_qa_options_are_typed_and_checked():
    with pytest.raises(ConfigError, match=r"unknown key 'env\.options\.taskgn' \(valid: corpus, "):
        SearchQAOptions.from_recipe(load_recipe(None, ["env.options.taskgn.seed=1"]))
    with pytest.raises(ConfigError, match=r"'env\.options\.taskgen\.n_people' expects int, got 'many'"):
        SearchQAOptions.from_recipe(load_recipe(None, ["env.options.taskgen.n_people=many"]))
    with pytest.raises(ConfigError, match="max_obs_tokens must be >= 1, got 0"):
        SearchQAOptions.from_options({"max_obs_tokens": 0})
    with pytest.raises(ConfigError, match="topk must be >= 1, got 0"):
        SearchQAOptions.from_options({"retriever": {"topk": 0}})
    with pytest.raises(ConfigError, match="max_invalid_actions must be >= 0"):
        SearchQAOptions.from_options({"max_invalid_actions": -1})
