"""WebEnv: one task's episode on the simulated web.

    env = WebEnv(task)
    observation = env.reset()                  # the task and the start page
    observation, done, info = env.step("click[3]")
    env.reward(), info["reward_parts"]         # once done

Any text is a legal input to `step`: a malformed or impossible action leaves
the page as it was and says why in the observation (and counts as invalid).
The episode ends on `answer[...]`, on the task's final act (an order, a
booking, a saved form) or after `task.max_steps` actions.

The reward has named parts, logged separately (see REWARD_WEIGHTS):
  success     1 when every constraint is met; for an unsolved episode, by `pay` (the `web_reward`
              setting): partial, the fraction of the constraints met; solved, 0; progress, the
              constraints met beyond those an episode that does nothing asked meets (the final
              act on the untouched page: a form saved or searched with its defaults; the guards:
              no other setting changed, one order), as a fraction of the rest, never below 0
  format      the fraction of turns that were one well-formed action, paid only in an episode
              that acted on the page (a click, search, ... that worked) before it answered:
              answering at once is no format to reward (docs/real-models.md, the web shortcut)
  efficiency  for a solved task, the scripted solution's length / the steps taken
  invalid     -0.1 for each action that was malformed or could not be done (at least -0.5)
"""

from __future__ import annotations

from functools import cached_property

from .actions import ACTION_HELP, Action, format_action, parse_action
from .sites import form_defaults, page, press
from .world import BrowserState

REWARD_WEIGHTS = {"success": 1.0, "format": 0.1, "efficiency": 0.2, "invalid": 1.0}
INVALID_PENALTY, INVALID_FLOOR = 0.1, 0.5
PAYS = ("partial", "solved", "progress")  # what an unsolved episode's success pays (above)
# Constraints against overdoing: any careless final act keeps them, so keeping them is no progress.
GUARDS = ("others_unchanged", "one_order")


def untouched_met(task, world) -> set[str]:
    """The constraints an episode meets without doing what its task asks: those the task's final act meets
    on the untouched page (a form saved, or searched and booked, with its defaults), and the guards."""
    state = BrowserState(task.start_url, account=dict(world.account), saves=1)
    defaults = {"from": "", "to": "", **form_defaults(state, "travel")}
    state.flight_searches, state.bookings = [defaults], [defaults]
    _, met = task.check(state)
    return {name for name, kept in met.items() if kept} | set(GUARDS)


def progress(met: dict[str, bool], untouched: set[str]) -> float:
    """The constraints met beyond those an untouched episode meets, as a fraction of those it misses; a
    constraint the untouched page met and the episode broke (a guard, a default) counts against it."""
    baseline = sum(name in untouched for name in met)
    room = len(met) - baseline
    return max(0.0, (sum(met.values()) - baseline) / room) if room else 0.0


class WebEnv:
    def __init__(self, task, max_steps: int | None = None, pay: str = "partial"):
        if pay not in PAYS:
            raise ValueError(f"pay must be one of {', '.join(PAYS)}; got {pay!r}")
        self.task = task
        self.pay = pay
        self.world = task.world()
        self.max_steps = max_steps or task.max_steps
        self.reset()

    # -- the protocol ---------------------------------------------------------

    def reset(self) -> str:
        self.state = BrowserState(self.task.start_url, account=dict(self.world.account))
        self.steps = self.invalid = self.well_formed = self.acted = 0
        self.done = False
        return f"Task: {self.task.instruction}\n{self._render()}"

    def step(self, action) -> tuple[str, bool, dict]:
        if self.done:
            return (
                "The episode is over.",
                True,
                {"valid": False, "error": "episode over", **self._final_info()},
            )
        self.steps += 1
        parsed, error = parse_action(action)
        if parsed is not None:
            self.well_formed += 1
            error = self._apply(parsed)
            self.acted += not error and parsed.name != "answer"
        if error:
            self.invalid += 1
        if (
            self.state.answer is not None
            or self.task.ends_episode(self.state)
            or self.steps >= self.max_steps
        ):
            self.done = True
        text = self._render()
        if error:
            text = f"Invalid action: {error}. Actions: {ACTION_HELP}\n{text}"
        info = {"valid": not error, "error": error, "step": self.steps}
        if self.done:
            info.update(self._final_info())
            text = "Episode finished.\n" + text
        return text, self.done, info

    @cached_property
    def untouched(self) -> set[str]:
        """untouched_met of this task: read only by `progress` pay, so made on first use."""
        return untouched_met(self.task, self.world)

    def reward_parts(self) -> dict[str, float]:
        score, met = self.task.check(self.state)
        solved = score >= 1.0
        if solved or self.pay == "partial":
            success = score
        else:
            success = progress(met, self.untouched) if self.pay == "progress" else 0.0
        return {
            "success": success,
            "format": self.well_formed / self.steps if self.acted else 0.0,
            "efficiency": min(1.0, len(self.task.plan) / self.steps) if solved else 0.0,
            "invalid": -min(INVALID_FLOOR, INVALID_PENALTY * self.invalid) if self.invalid else 0.0,
        }

    def reward(self) -> float:
        parts = self.reward_parts()
        return sum(REWARD_WEIGHTS[k] * v for k, v in parts.items())

    def solved(self) -> bool:
        return self.task.check(self.state)[0] >= 1.0

    # -- internals --------------------------------------------------------------

    def _final_info(self) -> dict:
        score, met = self.task.check(self.state)
        return {
            "reward": self.reward(),
            "reward_parts": self.reward_parts(),
            "constraints": met,
            "solved": score >= 1.0,
        }

    def _page(self):
        return page(self.world, self.state, self.state.url)

    def _form(self, url: str) -> dict[str, str]:
        if url not in self.state.forms:
            self.state.forms[url] = form_defaults(self.state, url)
        return self.state.forms[url]

    def _render(self) -> str:
        return self._page().render(self._form(self.state.url))

    def _go(self, url: str) -> None:
        self.state.history.append(self.state.url)
        self.state.url = url
        if url == "account/settings":  # a fresh visit shows the saved settings
            self.state.forms.pop(url, None)

    def _apply(self, action: Action) -> str:
        """Do one well-formed action; returns "" or why it could not be done."""
        current = self._page()
        form = self._form(current.url)
        if action.name == "answer":
            self.state.answer = action.args[0]
            return ""
        if action.name == "back":
            if not self.state.history:
                return "there is no previous page"
            self.state.url = self.state.history.pop()
            return ""
        if action.name == "search":
            if not current.search_button:
                return "this page has no search box"
            form[current.search_field] = action.args[0]
            return self._press(current.search_button, form)
        element = current.element(int(action.args[0]))
        if element is None:
            return f"there is no element [{action.args[0]}] on this page"
        if action.name == "click":
            if element.kind == "link":
                self._go(element.target)
                return ""
            if element.kind == "button":
                return self._press(element.target, form)
            return (
                f"[{element.id}] is a {element.kind}; use {'type' if element.kind == 'field' else 'select'}"
            )
        if action.name == "type":
            if element.kind != "field":
                return f"[{element.id}] is a {element.kind}, not a text field"
            form[element.name] = action.args[1]
            return ""
        # select
        if element.kind != "select":
            return f"[{element.id}] is a {element.kind}, not a drop-down"
        option = next((o for o in element.options if o.lower() == action.args[1].lower()), None)
        if option is None:
            return f"{action.args[1]!r} is not an option of [{element.id}] ({', '.join(element.options)})"
        form[element.name] = option
        return ""

    def _press(self, button: str, form: dict) -> str:
        url, message = press(self.world, self.state, button, form)
        if url:
            self._go(url)
        return message

    def resolve(self, step: tuple) -> str:
        """A scripted step (by element label) as an action string on the current page."""
        kind, *args = step
        current = self._page()
        if kind in ("answer", "search"):
            return format_action(kind, args[0])
        if kind == "back":
            return "back"
        if kind == "click_product":
            target = f"shop/product/{args[0]}"
            element = next(e for e in current.elements if e.kind == "link" and e.target == target)
            return format_action("click", element.id)
        element = current.find(args[0])
        if element is None:
            raise ValueError(f"scripted step {step} found no element {args[0]!r} on {current.url}")
        return format_action(kind, element.id, *args[1:])
