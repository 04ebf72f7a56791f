"""Deterministic synthetic search-QA: a fictional world, its corpus and its questions.

Every name is made up from syllables, so no model can know a fact without
retrieving it; the same `TaskGenConfig.seed` always gives the same world. People
are split ~80/20 into train and eval before any question is made, and every
question only involves people of its own split, so eval is held out.

Task kinds:
- single_hop: one fact of one person or company (one search).
- multi_hop: a fact of the entity linked to the subject (two searches).
- in_prompt: a fact of a *private* person, stated in `task.context` beside a
  distractor sentence about another private person. Private people are in no
  corpus document (like a user's own notes), so searching cannot help: the right
  move is to answer from the context without searching.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from ponder.rewards.search import PLANS, needs_search
from ponder.types import Task

KINDS = ("single_hop", "multi_hop", "in_prompt")
EVAL_FRACTION = 0.2
MIN_PEOPLE = 10  # eval then holds at least two private people, so in_prompt has a distractor

_ONSETS = (
    "b", "br", "d", "dr", "f", "g", "h", "k", "l", "m", "n", "p", "qu", "r", "s", "sh", "t", "th", "v", "z",
)  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ae", "ei")
_CODAS = ("n", "l", "r", "s", "th", "ck", "m", "nd", "rn", "ll", "sk", "wick", "mor", "vale")
_PROFESSIONS = (
    "glassblower", "cartographer", "beekeeper", "luthier", "archivist", "botanist",
    "clockmaker", "bookbinder", "astronomer", "engraver", "weaver", "potter",
    "surveyor", "apothecary", "locksmith", "falconer", "illustrator", "orchardist",
)  # fmt: skip
_COMPANY_SUFFIXES = ("Holdings", "Group", "Works", "Industries", "Labs", "Trading", "Foundry", "Partners")


@dataclass(frozen=True)
class _Relation:
    """How one relation is asked, looked for and stated ({s} subject, {v} value, {av} 'a/an value')."""

    question: str
    need: str
    fact: str


RELATIONS: dict[str, _Relation] = {
    "birth_city": _Relation(
        "In which city was {s} born?", "the city where {s} was born", "{s} was born in {v}"
    ),
    "birth_year": _Relation("In what year was {s} born?", "the year {s} was born", "{s} was born in {v}"),
    "profession": _Relation("What is the profession of {s}?", "the profession of {s}", "{s} works as {av}"),
    "employer": _Relation(
        "Which company does {s} work for?", "the company {s} works for", "{s} works for {v}"
    ),
    "founder": _Relation("Who founded {s}?", "the founder of {s}", "{s} was founded by {v}"),
    "hq_city": _Relation(
        "In which city is {s} headquartered?",
        "the city where {s} is headquartered",
        "{s} is headquartered in {v}",
    ),
    "founding_year": _Relation(
        "In what year was {s} founded?", "the year {s} was founded", "{s} was founded in {v}"
    ),
}
PERSON_RELATIONS = ("birth_city", "birth_year", "profession", "employer")
COMPANY_RELATIONS = ("founder", "hq_city", "founding_year")
# (bridge relation, target relation) -> question; the bridge's object is the second hop's subject.
MULTI_HOP_QUESTIONS: dict[tuple[str, str], str] = {
    ("employer", "hq_city"): "In which city is the headquarters of the company {s} works for?",
    ("employer", "founding_year"): "In what year was the company {s} works for founded?",
    ("founder", "birth_city"): "In which city was the founder of {s} born?",
    ("founder", "birth_year"): "In what year was the founder of {s} born?",
    ("founder", "profession"): "What is the profession of the founder of {s}?",
}


@dataclass
class Entity:
    """A person, company or city. `facts` maps relation -> answer text; `links` maps
    relation -> the id of the entity that text names (absent for years, professions)."""

    id: str
    kind: str
    name: str
    facts: dict[str, str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)


@dataclass
class TaskGenConfig:
    """env.options.taskgen: deterministic synthetic search-QA tasks (fictional entities).

    seed: generator seed; the same seed gives the same world, corpus and tasks.
    n_people: fictional people in the world (companies and cities scale with it).
    n_train / n_eval: tasks per split; eval tasks ask about different entities.
    single_hop / multi_hop / in_prompt: mix of task kinds (weights, normalised).
    plan: the oracle's first thought opens with the number of lookups the question
        needs ("No lookup needed.", "One lookup.", "Two lookups."), so a policy that
        imitates it commits to a plan at its first token, where the question is read.
    """

    seed: int = 0
    n_people: int = 120
    n_train: int = 256
    n_eval: int = 64
    single_hop: float = 0.5
    multi_hop: float = 0.25
    in_prompt: float = 0.25
    plan: bool = False


@dataclass
class SyntheticWorld:
    """The corpus ({"id", "contents"} with the entity name as first line) and both task splits."""

    corpus: list[dict]
    train: list[Task]
    eval: list[Task]


def generate_world(cfg: TaskGenConfig) -> SyntheticWorld:
    """Build the world, corpus and train/eval tasks from `cfg.seed` alone."""
    _check_config(cfg)
    rng = random.Random(cfg.seed)
    used = _reserved_words()
    entities = _build_entities(cfg.n_people, rng, used)
    corpus = [{"id": e.id, "contents": _document(e, entities)} for e in entities.values()]
    public = _split_people([e for e in entities.values() if e.kind == "person"], rng)
    private_people = _private_people(cfg.n_people, entities, rng, used)
    private = _split_people(private_people, rng)
    entities.update((p.id, p) for p in private_people)
    weights = {"single_hop": cfg.single_hop, "multi_hop": cfg.multi_hop, "in_prompt": cfg.in_prompt}
    train = _make_split("train", public["train"], private["train"], cfg.n_train, weights, entities, rng)
    held_out = _make_split("eval", public["eval"], private["eval"], cfg.n_eval, weights, entities, rng)
    if cfg.plan:
        for task in train + held_out:
            lookups = len(task.metadata["hops"]) if needs_search(task) else 0
            task.oracle_actions[0] = with_plan(task.oracle_actions[0], lookups)
    return SyntheticWorld(corpus=corpus, train=train, eval=held_out)


def with_plan(action: str, lookups: int) -> str:
    """`action` with its thought opened by the number of lookups the question needs."""
    return action.replace("<think>", f"<think>{PLANS[lookups]} ", 1)


def _split_people(people: list[Entity], rng: random.Random) -> dict[str, list[str]]:
    """Person ids split ~80/20 into train and eval, each sorted."""
    people = list(people)
    rng.shuffle(people)
    n_eval = max(1, round(EVAL_FRACTION * len(people)))
    return {"eval": sorted(p.id for p in people[:n_eval]), "train": sorted(p.id for p in people[n_eval:])}


def _check_config(cfg: TaskGenConfig) -> None:
    if cfg.n_people < MIN_PEOPLE:
        raise ValueError(f"env.options.taskgen.n_people must be at least {MIN_PEOPLE}, got {cfg.n_people}")
    if cfg.n_train < 0 or cfg.n_eval < 0:
        raise ValueError(f"env.options.taskgen.n_train and n_eval must be >= 0, got {cfg.n_train} and {cfg.n_eval}")
    weights = (cfg.single_hop, cfg.multi_hop, cfg.in_prompt)
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"env.options.taskgen kind weights must be >= 0 with a positive sum, got {weights}")


# ---------------------------------------------------------------- the world


def _reserved_words() -> set[str]:
    """Words of the templates: names must not collide with them, or a query for a
    name would also match every document that merely uses the word."""
    text = " ".join(
        [r.question + " " + r.need + " " + r.fact for r in RELATIONS.values()]
        + list(MULTI_HOP_QUESTIONS.values())
        + list(_PROFESSIONS)
        + list(_COMPANY_SUFFIXES)
        + ["is a company city home to the headquarters of and it founded born in works for"]
    )
    return set(re.findall(r"[a-z]+", text.lower()))


def _unique_word(rng: random.Random, used: set[str]) -> str:
    """A new capitalised two-syllable pseudo-word ("Varo", "Quennick"), recorded in `used`.
    Short words keep names to a few tokens for small policies."""
    for _ in range(10_000):
        first = (
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + (rng.choice(_CODAS[:6]) if rng.random() < 0.3 else "")
        )
        last = rng.choice(_ONSETS) + rng.choice(_VOWELS) + (rng.choice(_CODAS) if rng.random() < 0.5 else "")
        word = first + last
        if word not in used and "quu" not in word:
            used.add(word)
            return word.capitalize()
    raise RuntimeError("ran out of unique names; lower env.options.taskgen.n_people")


def _new_person(entity_id: str, cities: list[Entity], rng: random.Random, used: set[str]) -> Entity:
    """A person with a name, birth city, birth year and profession (no employer yet)."""
    person = Entity(entity_id, "person", f"{_unique_word(rng, used)} {_unique_word(rng, used)}")
    city = rng.choice(cities)
    person.facts.update(
        birth_city=city.name, birth_year=str(rng.randint(1940, 1999)), profession=rng.choice(_PROFESSIONS)
    )
    person.links["birth_city"] = city.id
    return person


def _build_entities(n_people: int, rng: random.Random, used: set[str]) -> dict[str, Entity]:
    """People, companies (~n/4) and cities (~n/6) with consistent facts, keyed by id."""
    width = max(3, len(str(n_people)))
    cities = [
        Entity(f"city-{i:0{width}d}", "city", _unique_word(rng, used)) for i in range(max(3, n_people // 6))
    ]
    people = [_new_person(f"person-{i:0{width}d}", cities, rng, used) for i in range(n_people)]
    founders = rng.sample(people, max(2, n_people // 4))
    companies = []
    for i, founder in enumerate(founders):
        name = f"{_unique_word(rng, used)} {rng.choice(_COMPANY_SUFFIXES)}"
        company = Entity(f"company-{i:0{width}d}", "company", name)
        city = rng.choice(cities)
        born = int(founder.facts["birth_year"])
        founded = born + rng.randint(20, min(55, 2023 - born))
        company.facts.update(founder=founder.name, hq_city=city.name, founding_year=str(founded))
        company.links.update(founder=founder.id, hq_city=city.id)
        companies.append(company)
    founded_by = {c.links["founder"]: c for c in companies}
    for person in people:
        # founders work for their own company; everyone else for a random one
        employer = founded_by.get(person.id) or rng.choice(companies)
        person.facts["employer"] = employer.name
        person.links["employer"] = employer.id
    return {e.id: e for e in people + companies + cities}


def _private_people(n: int, entities: dict[str, Entity], rng: random.Random, used: set[str]) -> list[Entity]:
    """n people of the same world (cities, employers) who appear in no document."""
    cities = [e for e in entities.values() if e.kind == "city"]
    companies = [e for e in entities.values() if e.kind == "company"]
    width = max(3, len(str(n)))
    people = [_new_person(f"private-{i:0{width}d}", cities, rng, used) for i in range(n)]
    for person in people:
        employer = rng.choice(companies)
        person.facts["employer"] = employer.name
        person.links["employer"] = employer.id
    return people


def _with_article(noun: str) -> str:
    return ("an " if noun[0].lower() in "aeiou" else "a ") + noun


def _document(entity: Entity, entities: dict[str, Entity]) -> str:
    """Title line, then prose that states each fact of the entity."""
    facts = entity.facts
    if entity.kind == "person":
        surname = entity.name.split()[-1]
        text = (
            f"{entity.name} is {_with_article(facts['profession'])} born in {facts['birth_year']} "
            f"in {facts['birth_city']}. {surname} works for {facts['employer']}."
        )
        employer = entities[entity.links["employer"]]
        if employer.links["founder"] == entity.id:
            text += f" {surname} founded {employer.name} in {employer.facts['founding_year']}."
    elif entity.kind == "company":
        text = (
            f"{entity.name} is a company headquartered in {facts['hq_city']}. "
            f"{entity.name} was founded in {facts['founding_year']} by {facts['founder']}."
        )
    else:
        based = [e.name for e in entities.values() if e.links.get("hq_city") == entity.id]
        text = f"{entity.name} is a city."
        if based:
            listed = based[0] if len(based) == 1 else ", ".join(based[:-1]) + " and " + based[-1]
            text += f" It is home to the headquarters of {listed}."
    return f"{entity.name}\n{text}"


# ---------------------------------------------------------------- the tasks


def kind_counts(n: int, weights: dict[str, float]) -> dict[str, int]:
    """Split n tasks over kinds in proportion to the weights (largest remainder), so the
    mix matches the weights as closely as integers allow instead of by chance."""
    total = sum(weights.values())
    exact = {kind: n * w / total for kind, w in weights.items()}
    counts = {kind: int(share) for kind, share in exact.items()}
    by_remainder = sorted(weights, key=lambda kind: (-(exact[kind] - counts[kind]), KINDS.index(kind)))
    for kind in by_remainder[: n - sum(counts.values())]:
        counts[kind] += 1
    return counts


def _question_pools(
    person_ids: list[str], private_ids: list[str], entities: dict[str, Entity]
) -> dict[str, list[tuple]]:
    """Every (subject id, relation or (bridge, target)) question a split may ask.
    A company belongs to its founder's split, so no hop chain crosses splits by a person;
    in_prompt questions are about the split's private people."""
    members = set(person_ids)
    company_ids = [e.id for e in entities.values() if e.kind == "company" and e.links["founder"] in members]
    single = [(p, r) for p in person_ids for r in PERSON_RELATIONS]
    single += [(c, r) for c in company_ids for r in COMPANY_RELATIONS]
    chains = list(MULTI_HOP_QUESTIONS)
    multi = [(p, chain) for p in person_ids for chain in chains if chain[0] == "employer"]
    multi += [(c, chain) for c in company_ids for chain in chains if chain[0] == "founder"]
    in_prompt = [(p, r) for p in private_ids for r in PERSON_RELATIONS]
    return {"single_hop": single, "multi_hop": multi, "in_prompt": in_prompt}


def _draw(pool: list[tuple], k: int, rng: random.Random) -> list[tuple]:
    """k questions from the pool, without repeats until the pool is used up."""
    drawn: list[tuple] = []
    while len(drawn) < k:
        batch = list(pool)
        rng.shuffle(batch)
        drawn += batch[: k - len(drawn)]
    return drawn


def _make_split(
    split: str,
    person_ids: list[str],
    private_ids: list[str],
    n: int,
    weights: dict[str, float],
    entities: dict[str, Entity],
    rng: random.Random,
) -> list[Task]:
    pools = _question_pools(person_ids, private_ids, entities)
    counts = kind_counts(n, weights)
    specs = [(kind, spec) for kind in KINDS for spec in _draw(pools[kind], counts[kind], rng)]
    rng.shuffle(specs)  # interleave kinds so any prefix of the split has the same mix
    tasks = []
    for i, (kind, (subject_id, relation)) in enumerate(specs):
        task_id = f"{split}-{i:04d}"
        subject = entities[subject_id]
        if kind == "single_hop":
            task = _single_hop_task(task_id, subject, relation)
        elif kind == "multi_hop":
            task = _multi_hop_task(task_id, subject, relation, entities)
        else:
            others = [entities[p] for p in private_ids if p != subject_id]
            task = _in_prompt_task(task_id, subject, relation, rng.choice(others), rng)
        task.metadata["split"] = split
        tasks.append(task)
    return tasks


def _fact(subject: Entity, relation: str) -> str:
    value = subject.facts[relation]
    return RELATIONS[relation].fact.format(s=subject.name, v=value, av=_with_article(value))


def _hop(subject: Entity, relation: str) -> dict:
    return {
        "subject_id": subject.id,
        "relation": relation,
        "object": subject.facts[relation],
        "object_id": subject.links.get(relation),
        "fact": _fact(subject, relation),
    }


def _search_action(thought: str, query: str) -> str:
    return f"<think>{thought}</think>\n<search>{query}</search>"


def _answer_action(thought: str, answer: str) -> str:
    return f"<think>{thought}</think>\n<answer>{answer}</answer>"


def _single_hop_task(task_id: str, subject: Entity, relation: str) -> Task:
    spec = RELATIONS[relation]
    answer = subject.facts[relation]
    oracle = [
        _search_action(f"I need {spec.need.format(s=subject.name)}.", subject.name),
        _answer_action(f"The information says {_fact(subject, relation)}.", answer),
    ]
    return Task(
        id=task_id,
        question=spec.question.format(s=subject.name),
        answers=[answer],
        kind="single_hop",
        oracle_actions=oracle,
        metadata={"subject_id": subject.id, "entities": [subject.id], "hops": [_hop(subject, relation)],
                  "needs_search": True},
    )


def _multi_hop_task(
    task_id: str, subject: Entity, chain: tuple[str, str], entities: dict[str, Entity]
) -> Task:
    bridge_relation, target_relation = chain
    bridge = entities[subject.links[bridge_relation]]
    answer = bridge.facts[target_relation]
    first_need = RELATIONS[bridge_relation].need.format(s=subject.name)
    second_need = RELATIONS[target_relation].need.format(s=bridge.name)
    oracle = [
        _search_action(f"I first need {first_need}.", subject.name),
        _search_action(
            f"The information says {_fact(subject, bridge_relation)}. Now I need {second_need}.", bridge.name
        ),
        _answer_action(f"The information says {_fact(bridge, target_relation)}.", answer),
    ]
    return Task(
        id=task_id,
        question=MULTI_HOP_QUESTIONS[chain].format(s=subject.name),
        answers=[answer],
        kind="multi_hop",
        oracle_actions=oracle,
        metadata={
            "subject_id": subject.id,
            "entities": [subject.id, bridge.id],
            "hops": [_hop(subject, bridge_relation), _hop(bridge, target_relation)],
            "needs_search": True,
        },
    )


def _in_prompt_task(
    task_id: str, subject: Entity, relation: str, distractor: Entity, rng: random.Random
) -> Task:
    fact = _fact(subject, relation)
    sentences = [fact + ".", _fact(distractor, relation) + "."]
    rng.shuffle(sentences)  # the fact is not always first, so position is no shortcut
    answer = subject.facts[relation]
    return Task(
        id=task_id,
        question=RELATIONS[relation].question.format(s=subject.name),
        answers=[answer],
        kind="in_prompt",
        context=" ".join(sentences),
        oracle_actions=[_answer_action(f"The context says {fact}.", answer)],
        metadata={
            "subject_id": subject.id,
            "entities": [subject.id],
            "hops": [_hop(subject, relation)],
            "distractor_id": distractor.id,
            "needs_search": False,
        },
    )
