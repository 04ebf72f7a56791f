import dataclasses
import re

import pytest

from ponder.envs.synthetic import TaskGenConfig, generate_world, kind_counts
from ponder.rewards.format import action_kind, format_compliance
from ponder.types import Trajectory, Turn

CFG = TaskGenConfig(seed=7, n_people=60, n_train=120, n_eval=40)


@pytest.fixture(scope="module")
def world():
    return generate_world(CFG)


def _docs(world):
    return {doc["id"]: doc["contents"] for doc in world.corpus}


def _people_in(task):
    """Every person id a task touches: subjects and objects of its hops, and its distractor."""
    ids = [task.metadata.get("distractor_id")] + task.metadata["entities"]
    for hop in task.metadata["hops"]:
        ids += [hop["subject_id"], hop["object_id"]]
    return {i for i in ids if i and i.startswith("person-")}


def test_same_seed_gives_identical_world(world):
    again = generate_world(dataclasses.replace(CFG))
    assert again.corpus == world.corpus
    assert again.train == world.train
    assert again.eval == world.eval


def test_different_seed_gives_different_world(world):
    other = generate_world(dataclasses.replace(CFG, seed=8))
    assert [d["contents"] for d in other.corpus] != [d["contents"] for d in world.corpus]
    assert [t.question for t in other.train] != [t.question for t in world.train]


def test_sizes_and_ids(world):
    assert [t.id for t in world.train] == [f"train-{i:04d}" for i in range(120)]
    assert [t.id for t in world.eval] == [f"eval-{i:04d}" for i in range(40)]
    ids = [d["id"] for d in world.corpus]
    assert len(set(ids)) == len(ids)
    assert sum(i.startswith("person-") for i in ids) == 60
    assert "person-017" in ids and "company-000" in ids and "city-000" in ids


def test_corpus_titles_are_unique_made_up_names(world):
    titles = [d["contents"].split("\n", 1)[0] for d in world.corpus]
    assert len(set(titles)) == len(titles)
    for title in titles:
        assert re.fullmatch(r"[A-Z][a-z]+( [A-Z][a-z]+)?", title), title


def test_person_document_states_its_facts(world):
    task = next(
        t for t in world.train if t.kind == "single_hop" and t.metadata["hops"][0]["relation"] == "birth_year"
    )
    doc = _docs(world)[task.metadata["subject_id"]]
    name = doc.split("\n")[0]
    assert f"{name} is a" in doc and f"born in {task.answers[0]} in " in doc and "works for" in doc


def test_eval_people_never_appear_in_train(world):
    train_people = set().union(*(_people_in(t) for t in world.train))
    eval_people = set().union(*(_people_in(t) for t in world.eval))
    assert train_people and eval_people
    assert not train_people & eval_people
    # ~80/20 split of 60 people: 12 held out, and eval tasks draw from them only
    assert len(eval_people) <= 12


def test_kind_counts_hand_computed():
    assert kind_counts(256, {"single_hop": 0.5, "multi_hop": 0.25, "in_prompt": 0.25}) == {
        "single_hop": 128,
        "multi_hop": 64,
        "in_prompt": 64,
    }
    # 10/3 each: the one left over goes to the first kind on ties
    assert kind_counts(10, {"single_hop": 1, "multi_hop": 1, "in_prompt": 1}) == {
        "single_hop": 4,
        "multi_hop": 3,
        "in_prompt": 3,
    }
    # exact shares 7*0.6=4.2, 7*0.3=2.1, 7*0.1=0.7: floors 4, 2, 0, the spare goes to 0.7
    assert kind_counts(7, {"single_hop": 0.6, "multi_hop": 0.3, "in_prompt": 0.1}) == {
        "single_hop": 4,
        "multi_hop": 2,
        "in_prompt": 1,
    }


def test_kind_counts_invariant_to_weight_scale():
    weights = {"single_hop": 0.5, "multi_hop": 0.3, "in_prompt": 0.2}
    for n in (0, 1, 9, 64, 257):
        scaled = {k: 40 * w for k, w in weights.items()}
        assert kind_counts(n, weights) == kind_counts(n, scaled)
        assert sum(kind_counts(n, weights).values()) == n


def test_kind_mix_follows_weights(world):
    kinds = [t.kind for t in world.train]
    # defaults 0.5 / 0.25 / 0.25 of 120
    assert (kinds.count("single_hop"), kinds.count("multi_hop"), kinds.count("in_prompt")) == (60, 30, 30)
    only_multi = generate_world(dataclasses.replace(CFG, single_hop=0, multi_hop=1, in_prompt=0))
    assert {t.kind for t in only_multi.train + only_multi.eval} == {"multi_hop"}


def test_answers_are_in_the_hop_chain_documents(world):
    docs = _docs(world)
    for task in world.train + world.eval:
        assert len(task.answers) == 1 and task.answers[0]
        assert task.answers[0] not in task.question
        if task.kind == "in_prompt":
            assert task.answers[0] in task.context
            assert task.metadata["needs_search"] is False
        else:
            assert task.metadata["needs_search"] is True and task.context is None
            last_hop = task.metadata["hops"][-1]
            assert task.answers[0] == last_hop["object"]
            assert task.answers[0] in docs[last_hop["subject_id"]]


def test_multi_hop_chain_links_up(world):
    docs = _docs(world)
    for task in (t for t in world.train + world.eval if t.kind == "multi_hop"):
        first, second = task.metadata["hops"]
        assert first["object_id"] == second["subject_id"] == task.metadata["entities"][1]
        # the bridge entity is named in the first document and titles the second
        assert first["object"] in docs[first["subject_id"]]
        assert docs[second["subject_id"]].startswith(first["object"] + "\n")


def test_in_prompt_context_has_fact_and_one_distractor_about_private_people(world):
    docs = _docs(world)
    corpus_text = "\n".join(docs.values())
    for task in (t for t in world.train + world.eval if t.kind == "in_prompt"):
        subject, distractor = task.metadata["subject_id"], task.metadata["distractor_id"]
        assert subject != distractor and subject.startswith("private-") and distractor.startswith("private-")
        assert task.context.count(".") == 2
        assert task.metadata["hops"][0]["fact"] + "." in task.context
        # a private person is in no document, so searching for them cannot help
        name = task.metadata["hops"][0]["fact"].split(" was ")[0].split(" works ")[0]
        assert name in task.question and name not in corpus_text


def test_oracle_actions_are_optimal_protocol_episodes(world):
    searches_for = {"single_hop": 1, "multi_hop": 2, "in_prompt": 0}
    docs = _docs(world)
    for task in world.train + world.eval:
        kinds = [action_kind(a) for a in task.oracle_actions]
        assert kinds == ["search"] * searches_for[task.kind] + ["answer"]
        final = re.search(r"<answer>(.*)</answer>", task.oracle_actions[-1]).group(1)
        assert final == task.answers[0]
        queries = [re.search(r"<search>(.*)</search>", a).group(1) for a in task.oracle_actions[:-1]]
        titles = [docs[e].split("\n")[0] for e in task.metadata["entities"][: len(queries)]]
        assert queries == titles
        turns = [Turn(index=i, action=a) for i, a in enumerate(task.oracle_actions)]
        assert format_compliance(Trajectory(task_id=task.id, prompt_ids=[], turns=turns), task) == 1.0


def test_oracle_queries_retrieve_their_document_first_with_bm25(world):
    bm25s = pytest.importorskip("bm25s")
    ids = [d["id"] for d in world.corpus]
    retriever = bm25s.BM25()
    retriever.index(
        bm25s.tokenize([d["contents"] for d in world.corpus], show_progress=False), show_progress=False
    )
    for task in world.train + world.eval:
        queries = [re.search(r"<search>(.*)</search>", a).group(1) for a in task.oracle_actions[:-1]]
        for query, entity in zip(queries, task.metadata["entities"][: len(queries)], strict=True):
            hits, _ = retriever.retrieve(
                bm25s.tokenize([query], show_progress=False), k=1, show_progress=False
            )
            assert ids[hits[0][0]] == entity, (task.id, query)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n_people": 9}, "n_people"),
        ({"n_train": -1}, "n_train"),
        ({"single_hop": 0, "multi_hop": 0, "in_prompt": 0}, "weights"),
        ({"multi_hop": -1}, "weights"),
    ],
)
def test_bad_config_is_rejected(change, message):
    with pytest.raises(ValueError, match=message):
        generate_world(dataclasses.replace(CFG, **change))


def test_more_tasks_than_distinct_questions_still_fills_the_split():
    small = generate_world(TaskGenConfig(seed=1, n_people=10, n_train=20, n_eval=200))
    assert len(small.eval) == 200
    eval_people = set().union(*(_people_in(t) for t in small.eval))
    train_people = set().union(*(_people_in(t) for t in small.train))
    assert len(eval_people) == 2 and not eval_people & train_people


def test_plan_opens_the_first_thought_with_the_lookups_needed(world):
    planned = generate_world(dataclasses.replace(CFG, plan=True))
    opening = {
        "in_prompt": "<think>No lookup needed. ",
        "single_hop": "<think>One lookup. ",
        "multi_hop": "<think>Two lookups. ",
    }
    for plain, task in zip(world.train + world.eval, planned.train + planned.eval, strict=True):
        assert task.id == plain.id and task.question == plain.question  # the same world
        assert task.oracle_actions[0] == plain.oracle_actions[0].replace("<think>", opening[task.kind], 1)
        assert task.oracle_actions[1:] == plain.oracle_actions[1:]
