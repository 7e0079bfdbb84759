"""Pages as text: numbered links, buttons, text fields and drop-down selects.

A page is a title and a list of lines; a line is plain text or one element.
Elements are numbered in reading order, starting at 1, every time a page is
built, so the same page always shows the same numbers. Rendering shows what a
person would see: a field's current value, a select's options and choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Element:
    kind: str  # "link" | "button" | "field" | "select"
    label: str  # the text shown
    target: str = ""  # link: the URL it opens; button: the name of what it does
    name: str = ""  # field/select: the form key its value is stored under
    options: list[str] = field(default_factory=list)  # select only
    id: int = 0  # set by Page


@dataclass
class Page:
    url: str
    title: str
    lines: list = field(default_factory=list)  # str or Element
    search_button: str = ""  # name of the button that `search[...]` presses; "" when none
    search_field: str = ""  # the form key `search[...]` types into

    def __post_init__(self):
        for i, el in enumerate(self.elements, start=1):
            el.id = i

    @property
    def elements(self) -> list[Element]:
        return [line for line in self.lines if isinstance(line, Element)]

    def element(self, element_id: int) -> Element | None:
        elements = self.elements
        return elements[element_id - 1] if 1 <= element_id <= len(elements) else None

    def find(self, label: str, kind: str | None = None) -> Element | None:
        """The first element whose label is `label` (case-insensitive), for scripted solutions."""
        for el in self.elements:
            if el.label.lower() == label.lower() and (kind is None or el.kind == kind):
                return el
        return None

    def render(self, form: dict[str, str]) -> str:
        out = [f"== {self.title} =="]
        for line in self.lines:
            out.append(line if isinstance(line, str) else render_element(line, form))
        return "\n".join(out)


def render_element(el: Element, form: dict[str, str]) -> str:
    if el.kind == "link":
        return f"[{el.id}] {el.label}"
    if el.kind == "button":
        return f"[{el.id}] <{el.label}>"
    value = form.get(el.name, "")
    if el.kind == "field":
        return f"[{el.id}] {el.label}: [{value}]"
    return f"[{el.id}] {el.label}: {value or '-'} (options: {', '.join(el.options)})"


def link(label: str, url: str) -> Element:
    return Element("link", label, target=url)


def button(label: str, action: str) -> Element:
    return Element("button", label, target=action)


def text_field(label: str, name: str) -> Element:
    return Element("field", label, name=name)


def select(label: str, name: str, options: list[str]) -> Element:
    return Element("select", label, name=name, options=list(options))
