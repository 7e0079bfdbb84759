"""A small fictional world for multi-hop questions, built from one seed.

Countries, cities, people and companies, each with one encyclopedia paragraph
that names its relations: a company's founder, chief executive and home city,
a person's birthplace, a city's country, a country's capital and language.
Names are made of syllables, so no answer can be known without reading.

A question follows a chain of relations from one named entity, 2 to 4 hops
("In which country was the founder of Kalomi born?": company -> founder ->
birthplace -> country), with a MuSiQue-style decomposition: one sub-question
per hop, "#1" standing for the previous hop's answer, and the paragraph that
answers it. `make_row(seed, hops)` gives a whole row in MuSiQue's format, so
the task treats it exactly as a MuSiQue row read from a file.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ra",
    "ten",
    "vo",
    "sa",
    "ri",
    "bel",
    "dor",
    "fa",
    "nu",
    "zel",
    "pa",
    "qui",
    "mor",
    "ta",
    "len",
    "gi",
    "os",
    "ver",
    "ul",
    "ban",
    "cy",
]
LANGUAGES = ["Alvish", "Borran", "Cetic", "Dunmari", "Estrel", "Fenwic", "Gorish", "Hallan"]
RIVERS = ["Amber", "Silver", "Stone", "Willow", "Crane", "Otter", "Heron", "Ash"]
PROFESSIONS = ["painter", "engineer", "poet", "sailor", "chemist", "architect", "composer", "banker"]
COUNTRIES, CITIES_PER_COUNTRY, PEOPLE, COMPANIES = 3, 2, 6, 4


@dataclass
class Entity:
    title: str
    kind: str  # country, city, person, company
    facts: dict  # relation -> value (another entity's title, or a plain value)

    def paragraph(self) -> str:
        f, t = self.facts, self.title
        if self.kind == "country":
            return f"{t} is a country whose capital is {f['capital']}. Its people speak {f['language']}."
        if self.kind == "city":
            return f"{t} is a city in {f['country']}, on the {f['river']} river."
        if self.kind == "person":
            article = "an" if f["profession"][0] in "aeiou" else "a"
            return f"{t} is {article} {f['profession']}. {t} was born in {f['born_in']}."
        return (
            f"{t} is a company founded by {f['founder']} in {f['year']}. "
            f"Its chief executive is {f['chief']}. "
            f"It is based in {f['city']}."
        )


def _name_pool(kind: str, count: int, syllables: int) -> list[str]:
    """A fixed list of made-up names of one kind (the same on every machine)."""
    rng = random.Random(f"multihop-names/{kind}")
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()
        if len(name) >= 4 and name not in names and all(name not in pool for pool in _POOLS.values()):
            names.append(name)
    _POOLS[kind] = names
    return names


# Worlds draw their names from small fixed pools (56 words), while the facts that join them
# are drawn afresh for every world, so nothing can be known without reading. Few names make
# each one a single token of a small tokenizer, and let the embedded tool model copy any of
# them (a head of 64 dimensions cannot keep hundreds of names apart).
_POOLS: dict[str, list[str]] = {}
COUNTRY_NAMES = _name_pool("country", 8, 3)
CITY_NAMES = _name_pool("city", 16, 2)
COMPANY_NAMES = _name_pool("company", 8, 3)
FIRST_NAMES = _name_pool("first", 12, 2)
LAST_NAMES = _name_pool("last", 12, 2)


def make_world(seed) -> dict[str, Entity]:
    """{title: Entity} of one world; the same seed gives the same world."""
    rng = random.Random(f"multihop-world/{seed}")
    world: dict[str, Entity] = {}
    countries = rng.sample(COUNTRY_NAMES, COUNTRIES)
    city_names = iter(rng.sample(CITY_NAMES, COUNTRIES * CITIES_PER_COUNTRY))
    cities = []
    for country, language in zip(countries, rng.sample(LANGUAGES, COUNTRIES)):
        names = [next(city_names) for _ in range(CITIES_PER_COUNTRY)]
        world[country] = Entity(country, "country", {"capital": names[0], "language": language})
        for city in names:
            world[city] = Entity(city, "city", {"country": country, "river": rng.choice(RIVERS)})
            cities.append(city)
    people = [
        f"{first} {last}"
        for first, last in zip(rng.sample(FIRST_NAMES, PEOPLE), rng.sample(LAST_NAMES, PEOPLE))
    ]
    for person in people:
        world[person] = Entity(
            person, "person", {"profession": rng.choice(PROFESSIONS), "born_in": rng.choice(cities)}
        )
    for company in rng.sample(COMPANY_NAMES, COMPANIES):
        founder, chief = rng.sample(people, 2)
        world[company] = Entity(
            company,
            "company",
            {"founder": founder, "chief": chief, "year": rng.randint(1820, 1990), "city": rng.choice(cities)},
        )
    return world


# A chain: (the kind it starts from, [(relation, sub-question with {x} for the entity)], the question).
CHAINS = {
    2: [
        (
            "company",
            [("founder", "Who founded {x}?"), ("born_in", "Where was {x} born?")],
            "Where was the founder of {x} born?",
        ),
        (
            "company",
            [("city", "Where is {x} based?"), ("country", "In which country is {x}?")],
            "In which country is {x} based?",
        ),
        (
            "person",
            [("born_in", "Where was {x} born?"), ("country", "In which country is {x}?")],
            "In which country was {x} born?",
        ),
    ],
    3: [
        (
            "company",
            [
                ("founder", "Who founded {x}?"),
                ("born_in", "Where was {x} born?"),
                ("country", "In which country is {x}?"),
            ],
            "In which country was the founder of {x} born?",
        ),
        (
            "company",
            [
                ("city", "Where is {x} based?"),
                ("country", "In which country is {x}?"),
                ("language", "What language do the people of {x} speak?"),
            ],
            "What language is spoken in the country where {x} is based?",
        ),
    ],
    4: [
        (
            "company",
            [
                ("founder", "Who founded {x}?"),
                ("born_in", "Where was {x} born?"),
                ("country", "In which country is {x}?"),
                ("language", "What language do the people of {x} speak?"),
            ],
            "What language is spoken in the country where the founder of {x} was born?",
        ),
        (
            "company",
            [
                ("chief", "Who is the chief executive of {x}?"),
                ("born_in", "Where was {x} born?"),
                ("country", "In which country is {x}?"),
                ("capital", "What is the capital of {x}?"),
            ],
            "What is the capital of the country where the chief executive of {x} was born?",
        ),
    ],
}
HOPS = tuple(CHAINS)


def chain_name(steps) -> str:
    """A chain's name: its relations in order, "city/country" for company -> city -> country."""
    return "/".join(relation for relation, _ in steps)


CHAIN_NAMES = tuple(chain_name(steps) for chains in CHAINS.values() for _, steps, _ in chains)


def aliases(world: dict[str, Entity], answer: str) -> list[str]:
    """Other ways to say an answer that should count as right."""
    entity = world.get(answer)
    if entity is not None and entity.kind == "city":
        return [f"{answer}, {entity.facts['country']}"]
    if answer in LANGUAGES:
        return [f"{answer} language", f"the {answer} language"]
    return []


def make_row(seed, hops: int, chains: list[str] | None = None) -> dict:
    """One question of `hops` hops on the world of `seed`, as a MuSiQue row (plus "prompt" and "seed").

    `chains` (names from CHAIN_NAMES) keeps only those chains of relations; None: any of `hops` hops."""
    if hops not in CHAINS:
        raise ValueError(f"multihop questions have {', '.join(map(str, HOPS))} hops, not {hops}")
    options = [c for c in CHAINS[hops] if chains is None or chain_name(c[1]) in chains]
    if not options:
        raise ValueError(f"no {hops}-hop question follows the chains {chains}")
    world = make_world(seed)
    rng = random.Random(f"multihop-question/{seed}/{hops}")
    # Drawn from all chains of this length first, so that a row's question does not depend on `chains`
    # when it is one of them.
    start_kind, steps, question = rng.choice(CHAINS[hops])
    if (start_kind, steps, question) not in options:
        start_kind, steps, question = rng.choice(options)
    start = rng.choice([e.title for e in world.values() if e.kind == start_kind])
    titles = sorted(world)
    rng.shuffle(titles)  # paragraph order says nothing about the answer
    current, decomposition = start, []
    for relation, sub_question in steps:
        entity = world[current]
        decomposition.append(
            {
                "id": len(decomposition),
                "question": sub_question.format(x=current if not decomposition else f"#{len(decomposition)}"),
                "answer": str(entity.facts[relation]),
                "paragraph_support_idx": titles.index(current),
            }
        )
        current = str(entity.facts[relation])
    supporting = {d["paragraph_support_idx"] for d in decomposition}
    text = question.format(x=start)
    return {
        "id": f"synthetic-{hops}hop-{seed}",
        "question": text,
        "prompt": text,
        "answer": current,
        "answer_aliases": aliases(world, current),
        "answerable": True,
        "hops": hops,
        "seed": seed,
        "question_decomposition": decomposition,
        "paragraphs": [
            {"idx": i, "title": t, "paragraph_text": world[t].paragraph(), "is_supporting": i in supporting}
            for i, t in enumerate(titles)
        ],
    }
