"""Procedural tasks on the simulated web, each with a deterministic checker.

Four families, three difficulty levels each:

========  =================================================================
fact      1: from a country's article, follow the link to its capital and name its river
          2: open a country from the home page, or search for a city or person; answer
          3: multi-hop: person -> birthplace -> country (or city -> country)
shop      1: buy the cheapest product of a department (prices are in the list)
          2: ... rated at least N stars (ratings are on product pages)
          3: a colour, a rating and a budget
travel    1: fill in and submit the flight search form
          2: book the cheapest flight for a route, day, class and party size
          3: the same, with the cities given as "the capital of X" (look them up)
account   1: change one setting on the settings page and save
          2: change two settings, starting from the account home page
          3: set the display name to a fact looked up in the encyclopedia
========  =================================================================

A task is fully determined by (family, difficulty, seed): the world, the
instruction and the scripted solution. `check` scores the browser state an
episode ended in: 1.0 when every constraint is met, partial credit for the
fraction met otherwise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from . import sites
from . import world as web_world
from .world import BrowserState, World, build_world

FAMILIES = ("fact", "shop", "travel", "account")
DIFFICULTIES = (1, 2, 3)


@dataclass
class WebTask:
    family: str
    difficulty: int
    seed: int
    instruction: str
    start_url: str
    goal: dict  # what the checker compares against
    plan: list[tuple] = field(repr=False, default_factory=list)  # the scripted solution, by element label

    @property
    def task_id(self) -> str:
        return f"{self.family}-{self.difficulty}-{self.seed}"

    @property
    def kind(self) -> str:
        """The task family and level, e.g. "fact/1": what the curriculum keeps statistics for."""
        return f"{self.family}/{self.difficulty}"

    @property
    def max_steps(self) -> int:
        return max(2 * len(self.plan), len(self.plan) + 4)

    def world(self) -> World:
        return build_world(self.seed)

    def oracle_actions(self) -> list[str]:
        """A scripted solution as action strings (element numbers resolved on each page)."""
        from .env import WebEnv

        env = WebEnv(self)
        env.reset()
        actions = []
        for step in self.plan:
            action = env.resolve(step)
            actions.append(action)
            env.step(action)
        return actions

    def ends_episode(self, state: BrowserState) -> bool:
        """Whether the state shows the task's final act (an answer always ends it too)."""
        if self.family == "shop":
            return bool(state.orders)
        if self.family == "travel":
            return bool(state.bookings) if self.difficulty > 1 else bool(state.flight_searches)
        if self.family == "account":
            return state.saves > 0
        return False

    def check(self, state: BrowserState) -> tuple[float, dict[str, bool]]:
        """(score in [0, 1], which constraints were met)."""
        met = CHECKERS[self.family](self, state)
        score = sum(met.values()) / len(met) if met else 0.0
        return score, met

    def row(self) -> dict:
        """The dataset row the trainer keeps: enough to rebuild the task."""
        return {
            "task_id": self.task_id,
            "family": self.family,
            "difficulty": self.difficulty,
            "seed": self.seed,
            "kind": self.kind,
            "instruction": self.instruction,
        }


def task_from_row(row: dict) -> WebTask:
    return make_task(row["family"], int(row["difficulty"]), int(row["seed"]))


def _same(a, b) -> bool:
    return str(a).strip().lower() == str(b).strip().lower()


# ---------------------------------------------------------------------------
# fact


def _fact(world: World, difficulty: int, rng: random.Random):
    if difficulty == 1:  # start on a country's article; the answer is one link away, on its capital's
        country = rng.choice(world.countries)
        city = world.city(country.capital)
        question = f"Which river runs through the capital of {country.name}?"
        return (
            question,
            f"wiki/{country.name}",
            {"answer": city.river},
            [("click", city.name), ("answer", city.river)],
        )
    if difficulty == 2:
        roll = rng.random()
        if roll < 1 / 3:  # from the home page's list of countries
            country = rng.choice(world.countries)
            attr, question = rng.choice(
                [
                    ("capital", "the capital"),
                    ("population", "the population (in millions)"),
                    ("language", "the language"),
                    ("currency", "the currency"),
                ]
            )
            answer = str(getattr(country, attr))
            return (
                f"What is {question} of {country.name}?",
                "wiki",
                {"answer": answer},
                [("click", country.name), ("answer", answer)],
            )
        if roll < 2 / 3:
            city = rng.choice(world.cities)
            attr, question = rng.choice(
                [
                    ("river", f"Which river runs through {city.name}?"),
                    ("founded", f"In which year was {city.name} founded?"),
                ]
            )
            answer, title = str(getattr(city, attr)), city.name
        else:
            person = rng.choice(world.people)
            attr, question = rng.choice(
                [
                    ("profession", f"What was the profession of {person.name}?"),
                    ("born", f"In which year was {person.name} born?"),
                ]
            )
            answer, title = str(getattr(person, attr)), person.name
        return question, "wiki", {"answer": answer}, [("search", title), ("click", title), ("answer", answer)]
    person = rng.choice(world.people)
    city = world.city(person.born_in)
    country = world.country(city.country)
    if rng.random() < 0.5:
        return (
            f"In which country was {person.name} born?",
            "wiki",
            {"answer": country.name},
            [("search", person.name), ("click", person.name), ("click", city.name), ("answer", country.name)],
        )
    return (
        f"What is the currency of the country where {person.name} was born?",
        "wiki",
        {"answer": country.currency},
        [
            ("search", person.name),
            ("click", person.name),
            ("click", city.name),
            ("click", country.name),
            ("answer", country.currency),
        ],
    )


def _check_fact(task: WebTask, state: BrowserState) -> dict[str, bool]:
    return {"answer": state.answer is not None and _same(state.answer, task.goal["answer"])}


# ---------------------------------------------------------------------------
# shop


def _shop(world: World, difficulty: int, rng: random.Random):
    categories = sorted({p.category for p in world.products})
    for _ in range(50):
        category = rng.choice(categories)
        pool = [p for p in world.products if p.category == category]
        if difficulty == 1:
            goal = {"category": category}
            text = f"Buy the cheapest {category}."
        elif difficulty == 2:
            stars = rng.randint(2, 4)
            goal = {"category": category, "min_rating": stars}
            text = f"Buy the cheapest {category} rated at least {stars} stars."
        else:
            p = rng.choice(pool)
            goal = {
                "category": category,
                "color": p.color,
                "min_rating": min(p.rating, rng.randint(2, 4)),
                "budget": p.price + rng.randint(0, 30),
            }
            text = (
                f"Buy a {goal['color']} {category} rated at least {goal['min_rating']} stars "
                f"for at most ${goal['budget']}."
            )
        matching = [p for p in pool if _matches(p, goal)]
        if matching:
            best = min(matching, key=lambda p: p.price)
            if best.in_stock:  # the task must be possible
                goal["cheapest"] = best.id if difficulty < 3 else None
                visit = [("click", category)]
                if difficulty > 1:  # look at each candidate's page before deciding (ratings are there)
                    for p in pool:
                        if p is not best and p.price < best.price:
                            visit += [("click_product", p.id), ("back",)]
                return text, "shop", goal, [*visit, ("click_product", best.id), ("click", "Buy now")]
    raise ValueError("no possible shop task in this world")


def _matches(p: web_world.Product, goal: dict) -> bool:
    return (
        p.category == goal["category"]
        and p.rating >= goal.get("min_rating", 0)
        and p.color == goal.get("color", p.color)
        and p.price <= goal.get("budget", p.price)
    )


def _check_shop(task: WebTask, state: BrowserState) -> dict[str, bool]:
    goal = task.goal
    if not state.orders:
        met = {"category": False}
        met.update({k: False for k in ("color", "min_rating", "budget") if k in goal})
        if goal.get("cheapest"):
            met["cheapest"] = False
        return met
    p = task.world().products[state.orders[-1] - 1]
    met = {"category": p.category == goal["category"]}
    if "color" in goal:
        met["color"] = p.color == goal["color"]
    if "min_rating" in goal:
        met["min_rating"] = p.rating >= goal["min_rating"]
    if "budget" in goal:
        met["budget"] = p.price <= goal["budget"]
    if goal.get("cheapest"):
        met["cheapest"] = p.id == goal["cheapest"]
    met["one_order"] = len(state.orders) == 1
    return met


# ---------------------------------------------------------------------------
# travel


def _travel(world: World, difficulty: int, rng: random.Random):
    a, b = rng.sample(world.countries, 2)
    goal = {
        "from": a.capital,
        "to": b.capital,
        "date": rng.choice(web_world.DAYS),
        "class": rng.choice(web_world.CLASSES),
        "passengers": rng.choice(web_world.PASSENGERS),
    }
    party = f"{goal['passengers']} passenger{'s' if goal['passengers'] != '1' else ''}"
    form = [("type", "From", goal["from"]), ("type", "To", goal["to"])]
    for name, label in (("date", "Date"), ("class", "Class"), ("passengers", "Passengers")):
        if goal[name] != sites.form_defaults(BrowserState("travel"), "travel")[name]:
            form.append(("select", label, goal[name]))
    form.append(("click", "Search flights"))
    if difficulty == 1:
        text = (
            f"Search for {goal['class']} flights from {goal['from']} to {goal['to']} on {goal['date']} "
            f"for {party}."
        )
        return text, "travel", goal, form
    flights = web_world.flights_for(world, goal["from"], goal["to"], goal["date"], goal["class"])
    goal["flight"] = min(flights, key=lambda f: f["price"])["flight"]
    book = [("click", f"Book {goal['flight']}")]
    if difficulty == 2:
        text = (
            f"Book the cheapest {goal['class']} flight from {goal['from']} to {goal['to']} on {goal['date']} "
            f"for {party}."
        )
        return text, "travel", goal, [*form, *book]
    text = (
        f"Book the cheapest {goal['class']} flight from the capital of {a.name} to the capital of {b.name} "
        f"on {goal['date']} for {party}."
    )
    look_up = [("click", a.name), ("back",), ("click", b.name), ("back",), ("click", "Flights")]
    return text, "wiki", goal, [*look_up, *form, *book]


def _check_travel(task: WebTask, state: BrowserState) -> dict[str, bool]:
    goal = task.goal
    keys = ("from", "to", "date", "class", "passengers")
    done = state.bookings if task.difficulty > 1 else state.flight_searches
    if not done:
        return {k: False for k in (*keys, *(("flight",) if "flight" in goal else ()))}
    last = done[-1]
    met = {k: _same(last[k], goal[k]) for k in keys}
    if "flight" in goal:
        met["flight"] = last.get("flight") == goal["flight"]
    return met


# ---------------------------------------------------------------------------
# account


def _account(world: World, difficulty: int, rng: random.Random):
    current = world.account
    changes = {
        "newsletter": "off",
        "language": rng.choice([x for x in web_world.SITE_LANGUAGES if x != current["language"]]),
        "email": (
            f"{rng.choice(web_world.SYLLABLES)}{rng.choice(web_world.SYLLABLES)}"
            f"{rng.randint(1, 99)}@mail.example"
        ),
        "display_name": "".join(rng.choice(web_world.SYLLABLES) for _ in range(2)).capitalize()
        + rng.choice(["", "x", "a"]),
    }
    labels = {
        "newsletter": "Newsletter",
        "language": "Language",
        "email": "Email",
        "display_name": "Display name",
    }
    phrases = {
        "newsletter": "turn the newsletter off",
        "language": "set the site language to {}",
        "email": "change your email to {}",
        "display_name": "change your display name to {}",
    }

    def edit(key, value):
        kind = "select" if key in ("newsletter", "language") else "type"
        return (kind, labels[key], value)

    if difficulty == 1:
        key = rng.choice(list(changes))
        goal = {key: changes[key]}
        text = _sentence(phrases[key].format(changes[key]))
        return text, "account/settings", goal, [edit(key, changes[key]), ("click", "Save")]
    if difficulty == 2:
        keys = sorted(rng.sample(list(changes), 2))
        goal = {k: changes[k] for k in keys}
        text = _sentence(" and ".join(phrases[k].format(changes[k]) for k in keys))
        return (
            text,
            "account",
            goal,
            [("click", "Settings"), *[edit(k, goal[k]) for k in keys], ("click", "Save")],
        )
    country = rng.choice(world.countries)
    goal = {"display_name": country.capital}
    text = f"Change your display name to the capital of {country.name}, then save."
    return (
        text,
        "wiki",
        goal,
        [
            ("click", country.name),
            ("back",),
            ("click", "My account"),
            ("click", "Settings"),
            edit("display_name", country.capital),
            ("click", "Save"),
        ],
    )


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + ", then save."


def _check_account(task: WebTask, state: BrowserState) -> dict[str, bool]:
    met = {k: state.saves > 0 and _same(state.account.get(k, ""), v) for k, v in task.goal.items()}
    # Settings the task did not mention must keep their values.
    original = task.world().account
    met["others_unchanged"] = state.saves > 0 and all(
        _same(state.account.get(k, ""), v) for k, v in original.items() if k not in task.goal
    )
    return met


MAKERS = {"fact": _fact, "shop": _shop, "travel": _travel, "account": _account}
CHECKERS = {"fact": _check_fact, "shop": _check_shop, "travel": _check_travel, "account": _check_account}


def make_task(family: str, difficulty: int, seed: int) -> WebTask:
    """The task of a family and level in the world of `seed`: the same for the same arguments."""
    if family not in MAKERS:
        raise ValueError(f"unknown task family {family!r}; choose from {', '.join(FAMILIES)}")
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    world = build_world(seed)
    rng = random.Random(f"web-task/{family}/{difficulty}/{seed}")
    text, start, goal, plan = MAKERS[family](world, difficulty, rng)
    return WebTask(family, difficulty, seed, text, start, goal, plan)


def generate_tasks(n: int, seed: int, difficulty: int | None = None, families=None) -> list[WebTask]:
    """`n` distinct tasks, the same list for the same arguments.

    Families take turns; levels take turns too unless `difficulty` fixes one.
    Each task lives in its own world, drawn from (seed, position).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if difficulty is not None and difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES} or None, got {difficulty!r}")
    families = tuple(families or FAMILIES)
    for f in families:
        if f not in MAKERS:
            raise ValueError(f"unknown task family {f!r}; choose from {', '.join(FAMILIES)}")
    rng = random.Random(f"web-tasks/{seed}")
    tasks, seen, i = [], set(), 0
    while len(tasks) < n:
        family = families[i % len(families)]
        level = difficulty or DIFFICULTIES[(i // len(families)) % len(DIFFICULTIES)]
        i += 1
        try:
            task = make_task(family, level, rng.getrandbits(31))
        except ValueError:  # a world with no possible task of this kind: draw another
            continue
        # Distinct tasks: a different world makes a different task, even with the same words
        # ("Buy the cheapest lamp." has other lamps in each world).
        if task.task_id not in seen:
            seen.add(task.task_id)
            tasks.append(task)
    return tasks
