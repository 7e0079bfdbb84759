"""The made-up facts behind the simulated web (sites.py), built from one seed, fully offline.

A `World` holds the countries, cities, people and products (names are built from
syllables, so no real fact can be guessed) and `flights_for` its flights; a
`BrowserState` is everything an episode changes. Both are plain data, so a task
replays exactly.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field

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
LANGUAGES = ["Alvish", "Borran", "Cetic", "Dunmari", "Estrel", "Fenwic"]
CURRENCIES = ["crown", "mark", "florin", "dinar", "real", "shell"]
RIVERS = ["Amber", "Silver", "Stone", "Willow", "Crane", "Otter"]
PROFESSIONS = ["painter", "engineer", "poet", "sailor", "chemist", "architect", "composer"]
CATEGORIES = ["lamp", "kettle", "backpack", "jacket", "chair", "headphones"]
COLORS = ["red", "blue", "black", "green", "white"]
BRANDS = ["Vexa", "Orin", "Tamo", "Kelby", "Nuvo", "Pell", "Quarto", "Sima"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
CLASSES = ["economy", "business"]
PASSENGERS = ["1", "2", "3", "4"]
NEWSLETTER = ["on", "off"]
SITE_LANGUAGES = ["English", "French", "Spanish", "German"]


def _name(rng: random.Random, used: set[str], parts: int = 2) -> str:
    while True:
        name = "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()
        if name not in used and len(name) >= 4:
            used.add(name)
            return name


@dataclass
class Country:
    name: str
    capital: str
    population: int  # millions
    language: str
    currency: str


@dataclass
class City:
    name: str
    country: str
    river: str
    founded: int


@dataclass
class Person:
    name: str
    profession: str
    born_in: str  # a city
    born: int  # year


@dataclass
class Product:
    id: int
    brand: str
    category: str
    color: str
    price: int
    rating: int  # stars, 1..5
    in_stock: bool

    @property
    def name(self) -> str:
        return f"{self.brand} {self.category}"


@dataclass
class World:
    seed: int
    countries: list[Country]
    cities: list[City]
    people: list[Person]
    products: list[Product]
    account: dict[str, str]

    def article(self, title: str):
        for item in (*self.countries, *self.cities, *self.people):
            if item.name.lower() == title.lower():
                return item
        return None

    def country(self, name: str) -> Country:
        return next(c for c in self.countries if c.name == name)

    def city(self, name: str) -> City:
        return next(c for c in self.cities if c.name == name)


def build_world(seed: int) -> World:
    """The same facts for the same seed, on every machine (a string-seeded RNG)."""
    rng = random.Random(f"web-world/{seed}")
    used: set[str] = set()
    countries, cities, people = [], [], []
    languages, currencies = rng.sample(LANGUAGES, 4), rng.sample(CURRENCIES, 4)
    for i in range(4):
        country = Country(_name(rng, used), "", rng.randint(2, 90), languages[i], currencies[i])
        for j in range(2):
            city = City(_name(rng, used), country.name, rng.choice(RIVERS), rng.randint(900, 1800))
            cities.append(city)
            if j == 0:
                country.capital = city.name
        countries.append(country)
    for _ in range(5):
        people.append(
            Person(
                _name(rng, used, 3), rng.choice(PROFESSIONS), rng.choice(cities).name, rng.randint(1700, 1990)
            )
        )
    products = []
    for category in rng.sample(CATEGORIES, 3):
        prices = rng.sample(range(8, 120), 5)  # distinct prices: "the cheapest" is never a tie
        for price in prices:
            products.append(
                Product(
                    len(products) + 1,
                    rng.choice(BRANDS),
                    category,
                    rng.choice(COLORS),
                    price,
                    rng.randint(1, 5),
                    rng.random() < 0.75,
                )
            )
    account = {
        "display_name": _name(rng, used),
        "email": f"{_name(rng, used).lower()}@mail.example",
        "newsletter": "on",
        "language": "English",
    }
    return World(seed, countries, cities, people, products, account)


@dataclass
class BrowserState:
    """Everything an episode changes: where the browser is and what was done."""

    url: str
    history: list[str] = field(default_factory=list)
    forms: dict[str, dict[str, str]] = field(default_factory=dict)  # url -> field name -> value
    orders: list[int] = field(default_factory=list)  # product ids bought
    bookings: list[dict] = field(default_factory=list)  # flights booked
    flight_searches: list[dict] = field(default_factory=list)  # submitted search forms
    account: dict[str, str] = field(default_factory=dict)  # saved settings
    saves: int = 0
    answer: str | None = None


def flights_for(world: World, origin: str, destination: str, day: str, travel_class: str) -> list[dict]:
    """Three flights for a route, day and class: made up, but the same every time."""
    key = f"{world.seed}/{origin.lower()}/{destination.lower()}/{day}/{travel_class}"
    rng = random.Random(zlib.crc32(key.encode()))
    base = 3 if travel_class == "business" else 1
    prices = rng.sample(range(60, 400), 3)
    return [
        {
            "flight": f"{'AB'[i % 2]}{rng.randint(100, 999)}",
            "departs": f"{rng.randint(6, 21):02d}:{rng.choice(['00', '30'])}",
            "price": p * base,
        }
        for i, p in enumerate(prices)
    ]
