"""The simulated web: four small sites built from one seed, fully offline.

* ``wiki``    an encyclopedia: countries, cities and people, with linked articles
              and a search box;
* ``shop``    a shop: search, result lists with prices, product pages, "Buy now";
* ``travel``  a flight booking form (from, to, date, class, passengers), results, booking;
* ``account`` an account site with a settings form that can be saved.

A `World` holds the made-up facts (world.py: names are built from syllables, so
no real fact can be guessed). `page(world, state, url)` builds the page at a URL and
`press(world, state, action, form)` does what a button does: both are pure
functions of the world and the browser state, so a task replays exactly.
"""

from __future__ import annotations

from .pages import Page, button, link, select, text_field
from .world import (
    CLASSES,
    DAYS,
    NEWSLETTER,
    PASSENGERS,
    SITE_LANGUAGES,
    BrowserState,
    City,
    Country,
    World,
    flights_for,
)

HOMES = {"wiki": "Encyclopedia", "shop": "Shop", "travel": "Flights", "account": "My account"}


# ---------------------------------------------------------------------------
# Pages


def page(world: World, state: BrowserState, url: str) -> Page:
    """The page at `url`; an unknown URL gives a "not found" page, never an error."""
    site, _, rest = url.partition("/")
    builder = {"wiki": _wiki, "shop": _shop, "travel": _travel, "account": _account}.get(site)
    built = builder(world, state, rest) if builder else None
    return built or Page(
        url, "Page not found", ["There is nothing at this address.", link("Encyclopedia", "wiki")]
    )


def _nav(current: str) -> list:
    return [link(title, site) for site, title in HOMES.items() if site != current]


def _query(rest: str, prefix: str) -> str | None:
    return rest[len(prefix) :] if rest.startswith(prefix) else None


def _wiki(world: World, state: BrowserState, rest: str) -> Page | None:
    if rest == "":
        return Page(
            "wiki",
            "Encyclopedia",
            [
                text_field("Search articles", "q"),
                button("Search", "wiki_search"),
                "Countries:",
                *[link(c.name, f"wiki/{c.name}") for c in world.countries],
                *_nav("wiki"),
            ],
            search_button="wiki_search",
            search_field="q",
        )
    query = _query(rest, "search?q=")
    if query is not None:
        words = [w for w in query.lower().split() if w]
        titles = [x.name for x in (*world.countries, *world.cities, *world.people)]
        hits = [t for t in titles if words and any(w in t.lower() for w in words)]
        lines = [f"Results for '{query}':"] + ([link(t, f"wiki/{t}") for t in hits] or ["No articles found."])
        return Page(
            f"wiki/{rest}",
            "Encyclopedia search",
            [
                text_field("Search articles", "q"),
                button("Search", "wiki_search"),
                *lines,
                link("Encyclopedia home", "wiki"),
            ],
            search_button="wiki_search",
            search_field="q",
        )
    item = world.article(rest)
    if item is None:
        return None
    if isinstance(item, Country):
        body = [
            f"{item.name} is a country.",
            "Capital:",
            link(item.capital, f"wiki/{item.capital}"),
            f"Population: {item.population} million",
            f"Language: {item.language}",
            f"Currency: {item.currency}",
        ]
    elif isinstance(item, City):
        capital = world.country(item.country).capital == item.name
        body = [
            f"{item.name} is a {'capital ' if capital else ''}city.",
            "Country:",
            link(item.country, f"wiki/{item.country}"),
            f"River: {item.river}",
            f"Founded: {item.founded}",
        ]
    else:
        body = [
            f"{item.name} was a {item.profession}.",
            f"Born: {item.born}",
            "Birthplace:",
            link(item.born_in, f"wiki/{item.born_in}"),
        ]
    return Page(f"wiki/{item.name}", item.name, [*body, link("Encyclopedia home", "wiki")])


def _shop(world: World, state: BrowserState, rest: str) -> Page | None:
    if rest == "":
        categories = sorted({p.category for p in world.products})
        return Page(
            "shop",
            "Shop",
            [
                text_field("Search products", "q"),
                button("Search", "shop_search"),
                "Departments:",
                *[link(c, f"shop/search?q={c}") for c in categories],
                *_nav("shop"),
            ],
            search_button="shop_search",
            search_field="q",
        )
    query = _query(rest, "search?q=")
    if query is not None:
        words = [w.rstrip("s") for w in query.lower().split() if w]
        hits = [
            p
            for p in world.products
            if words and all(any(w in f for f in (p.category, p.brand.lower(), p.color)) for w in words)
        ]
        lines = [f"Results for '{query}':"]
        for p in hits:
            lines += [link(p.name, f"shop/product/{p.id}"), f"  price ${p.price}"]
        return Page(
            f"shop/{rest}",
            "Shop search",
            [
                text_field("Search products", "q"),
                button("Search", "shop_search"),
                *(lines if hits else lines + ["No products found."]),
                link("Shop home", "shop"),
            ],
            search_button="shop_search",
            search_field="q",
        )
    pid = _query(rest, "product/")
    if pid is not None and pid.isdigit() and 1 <= int(pid) <= len(world.products):
        p = world.products[int(pid) - 1]
        return Page(
            f"shop/{rest}",
            p.name,
            [
                f"Price: ${p.price}",
                f"Color: {p.color}",
                f"Rating: {p.rating} stars",
                "In stock" if p.in_stock else "Out of stock",
                button("Buy now", f"buy:{p.id}"),
                link("Shop home", "shop"),
            ],
        )
    oid = _query(rest, "order/")
    if oid is not None and oid.isdigit() and 1 <= int(oid) <= len(world.products):
        return Page(
            f"shop/{rest}",
            "Order placed",
            [f"You bought the {world.products[int(oid) - 1].name}.", link("Shop home", "shop")],
        )
    if rest == "unavailable":
        return Page(
            "shop/unavailable", "Not available", ["That product is out of stock.", link("Shop home", "shop")]
        )
    return None


def _travel(world: World, state: BrowserState, rest: str) -> Page | None:
    if rest == "":
        return Page(
            "travel",
            "Flights",
            [
                "Find a flight.",
                text_field("From", "from"),
                text_field("To", "to"),
                select("Date", "date", DAYS),
                select("Class", "class", CLASSES),
                select("Passengers", "passengers", PASSENGERS),
                button("Search flights", "flight_search"),
                *_nav("travel"),
            ],
        )
    if rest == "results" and state.flight_searches:
        search = state.flight_searches[-1]
        lines = [
            f"Flights from {search['from']} to {search['to']} on {search['date']}, {search['class']}, "
            f"{search['passengers']} passenger(s):"
        ]
        for i, f in enumerate(
            flights_for(world, search["from"], search["to"], search["date"], search["class"])
        ):
            lines += [
                f"  {f['flight']} departs {f['departs']}, ${f['price']} per person",
                button(f"Book {f['flight']}", f"book:{i}"),
            ]
        return Page("travel/results", "Flight results", [*lines, link("New search", "travel")])
    if rest == "booked" and state.bookings:
        b = state.bookings[-1]
        return Page(
            "travel/booked",
            "Booking confirmed",
            [
                f"Flight {b['flight']} from {b['from']} to {b['to']} on {b['date']}, {b['class']}, "
                f"{b['passengers']} passenger(s).",
                link("Flights home", "travel"),
            ],
        )
    return None


def _account(world: World, state: BrowserState, rest: str) -> Page | None:
    if rest == "":
        return Page(
            "account",
            "My account",
            [
                f"Signed in as {state.account['display_name']}.",
                link("Settings", "account/settings"),
                *_nav("account"),
            ],
        )
    if rest == "settings":
        return Page(
            "account/settings",
            "Settings",
            [
                text_field("Display name", "display_name"),
                text_field("Email", "email"),
                select("Newsletter", "newsletter", NEWSLETTER),
                select("Language", "language", SITE_LANGUAGES),
                button("Save", "save_settings"),
                link("Account home", "account"),
            ],
        )
    if rest == "saved":
        return Page(
            "account/saved",
            "Settings saved",
            [
                "Your settings were saved.",
                link("Settings", "account/settings"),
                link("Account home", "account"),
            ],
        )
    return None


def form_defaults(state: BrowserState, url: str) -> dict[str, str]:
    """What a form shows before anything is typed: the saved settings; travel's first options."""
    if url == "account/settings":
        return dict(state.account)
    if url == "travel":
        return {"date": DAYS[0], "class": CLASSES[0], "passengers": PASSENGERS[0]}
    return {}


# ---------------------------------------------------------------------------
# Buttons


def press(world: World, state: BrowserState, action: str, form: dict[str, str]) -> tuple[str | None, str]:
    """Do what a button does. Returns (URL to open or None to stay, a message; "" when it worked)."""
    if action in ("wiki_search", "shop_search"):
        query = form.get("q", "").strip()
        if not query:
            return None, "Type something to search for first."
        return f"{action.split('_')[0]}/search?q={query}", ""
    if action.startswith("buy:"):
        product = world.products[int(action[4:]) - 1]
        if not product.in_stock:
            return "shop/unavailable", ""
        state.orders.append(product.id)
        return f"shop/order/{product.id}", ""
    if action == "flight_search":
        missing = [k for k in ("from", "to") if not form.get(k, "").strip()]
        if missing:
            return None, f"Fill in {' and '.join(missing)} first."
        state.flight_searches.append(
            {k: form.get(k, "").strip() for k in ("from", "to", "date", "class", "passengers")}
        )
        return "travel/results", ""
    if action.startswith("book:"):
        search = state.flight_searches[-1]
        flight = flights_for(world, search["from"], search["to"], search["date"], search["class"])[
            int(action[5:])
        ]
        state.bookings.append({**search, **flight})
        return "travel/booked", ""
    if action == "save_settings":
        state.account.update({k: form.get(k, state.account[k]).strip() for k in state.account})
        state.saves += 1
        return "account/saved", ""
    return None, "Nothing happens."
