"""Assistant-only label masks on multi-turn tool conversations, and trajectory
conversion that gives back the rollout engine's exact ids and mask."""

import pytest

from ponder.config import load_recipe
from ponder.data import ChatFormatter, Conversation, TokenizedExample, pack, trajectory_to_conversation
from ponder.envs.data import load_search_qa
from ponder.envs.search_qa import SearchQAEnvFactory, SearchQAOptions, build_messages
from ponder.models import tiny_tokenizer
from ponder.tools.retrieval import build_retriever
from ponder.types import ToolSpec

TOOLS = [{"type": "function", "function": {"name": "search", "description": "look up", "parameters": {}}}]
CONVERSATION = Conversation(
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where was Ann born?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"query": "Ann"}}}]},
        {"role": "tool", "content": "Ann was born in Oslo."},
        {"role": "assistant", "content": "Oslo"},
    ],
    TOOLS, "tool_selection", "c1",
)  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _spans(tokenizer, example, value):
    """Decoded maximal runs of tokens whose mask equals `value`."""
    runs, current = [], []
    for token, mask in zip(example.input_ids, example.loss_mask):
        if mask == value:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current)), current.clear()
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_hermes_mask_covers_exactly_the_assistant_turns_and_their_calls(tokenizer):
    example = ChatFormatter(tokenizer, "hermes")(CONVERSATION)
    assert _spans(tokenizer, example, 1) == [
        'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "Ann"}}\n</tool_call><|im_end|>',
        "Oslo<|im_end|>",
    ]
    text = tokenizer.decode(example.input_ids)
    assert '<tools>{"type": "function", "function": {"name": "search"' in text
    assert "<|im_start|>tool\n<tool_response>\nAnn was born in Oslo.\n</tool_response><|im_end|>" in text
    assert all("Oslo." not in span for span in _spans(tokenizer, example, 1))  # tool output never trained on


def test_template_style_masks_the_same_assistant_text(tokenizer):
    plain = Conversation([m for m in CONVERSATION.messages if "tool_calls" not in m and m["role"] != "tool"])
    example = ChatFormatter(tokenizer, "template")(plain)
    assert _spans(tokenizer, example, 1) == ["Oslo<|im_end|>\n"]
    with pytest.raises(ValueError, match="does not take tools="):
        ChatFormatter(tokenizer, "template")(CONVERSATION)


def test_inline_conversion_gives_back_the_engines_ids_and_mask(tokenizer):
    from ponder.models import tiny_policy
    from ponder.train.sft import build_demonstrations

    recipe = load_recipe(None, ["model.name=tiny", "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=12",
                                "env.options.retriever.topk=1", "env.options.max_obs_tokens=32",
                                "rollout.sampling.max_new_tokens_per_turn=256"])  # fmt: skip
    data = load_search_qa(SearchQAOptions.from_recipe(recipe))
    tasks = [t for t in data.train if t.kind == "multi_hop"][:2] + [
        t for t in data.train if t.kind == "in_prompt"
    ][:1]
    policy = tiny_policy()
    demonstrations = build_demonstrations(
        tasks, "oracle", SearchQAEnvFactory.from_recipe(recipe, build_retriever("bm25", data.corpus), policy.tokenizer),
        policy, recipe,
    )
    assert len(demonstrations) == 3
    formatter = ChatFormatter(policy.tokenizer, "inline")
    by_id = {t.id: t for t in tasks}
    for trajectory in demonstrations:
        task = by_id[trajectory.task_id]
        conversation = trajectory_to_conversation(
            trajectory, task, build_messages(task), [ToolSpec("search", "")]
        )
        example = formatter(conversation)
        assert example.input_ids == trajectory.prompt_ids + trajectory.response_ids
        assert example.loss_mask == [0] * len(trajectory.prompt_ids) + trajectory.loss_mask
    assert conversation.task_type == "timing_decision"


def test_unknown_style_lists_the_valid_ones(tokenizer):
    with pytest.raises(ValueError, match="^unknown tool style 'chatml'; valid: hermes, inline, template$"):
        ChatFormatter(tokenizer, "chatml")


def test_pack_concatenates_up_to_the_row_length():
    examples = [TokenizedExample([1, 2], [0, 1], id="a"), TokenizedExample([3], [1], id="b"),
                TokenizedExample([4, 5, 6], [0, 1, 1], id="c")]  # fmt: skip
    rows = pack(examples, 4)
    assert [(r.input_ids, r.loss_mask, r.id) for r in rows] == [
        ([1, 2, 3], [0, 1, 1], "a+b"),
        ([4, 5, 6], [0, 1, 1], "c"),
    ]
    assert examples[0].input_ids == [1, 2]  # inputs untouched
