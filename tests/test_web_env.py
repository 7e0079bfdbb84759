"""The simulated web: generator, oracle, checker, invalid actions, reward parts."""

import random

import pytest

from rewards.web_browsing import FAMILIES, WebEnv, generate_tasks, make_task, parse_action
from rewards.web_browsing.actions import ACTION_HELP
from rewards.web_browsing.env import progress


def run(task, actions, env=None):
    env = env or WebEnv(task)
    env.reset()
    info, done = {}, False
    for a in actions:
        obs, done, info = env.step(a)
        if done:
            break
    return env, done, info


def booking_with_wrong_day(task) -> list[str]:
    """A travel task's scripted booking with another day selected: all but one constraint met."""
    actions = task.oracle_actions()
    wrong_day = next(d for d in ("Monday", "Sunday") if d != task.goal["date"])
    if not any(a.startswith("select[3]") for a in actions):
        return actions[:-1] + [f"select[3][{wrong_day}]", actions[-1]]
    return [a if not a.startswith("select[3]") else f"select[3][{wrong_day}]" for a in actions]


def test_generator_is_deterministic_distinct_and_covers_every_family_and_level():
    tasks = generate_tasks(300, seed=0)
    again = generate_tasks(300, seed=0)
    assert [t.task_id for t in tasks] == [t.task_id for t in again]
    assert [t.instruction for t in tasks] == [t.instruction for t in again]
    assert len({t.task_id for t in tasks}) == 300
    assert len({(t.instruction, t.start_url) for t in tasks}) > 250  # few share their words
    assert {(t.family, t.difficulty) for t in tasks} == {(f, d) for f in FAMILIES for d in (1, 2, 3)}
    assert [t.task_id for t in generate_tasks(20, seed=1)] != [t.task_id for t in tasks[:20]]
    assert all(t.difficulty == 2 for t in generate_tasks(12, seed=3, difficulty=2))
    # a task is rebuilt exactly from (family, difficulty, seed)
    t = tasks[7]
    assert make_task(t.family, t.difficulty, t.seed).instruction == t.instruction


def test_oracle_solves_every_task_with_full_reward():
    for task in generate_tasks(360, seed=5):
        actions = task.oracle_actions()
        env, done, info = run(task, actions)
        assert done and info["solved"], (task.task_id, task.instruction, actions, info)
        assert info["reward_parts"] == {"success": 1.0, "format": 1.0, "efficiency": 1.0, "invalid": 0.0}
        assert env.reward() == pytest.approx(1.3)  # 1.0 success + 0.1 format + 0.2 efficiency
        assert all(parse_action(a)[0] is not None for a in actions)


def test_harder_levels_need_more_steps():
    tasks = generate_tasks(240, seed=2)
    mean = {d: sum(len(t.plan) for t in tasks if t.difficulty == d) / 80 for d in (1, 2, 3)}
    assert mean[1] < mean[2] < mean[3], mean


def random_action(rng):
    kind = rng.choice(["click", "click", "click", "type", "select", "search", "back", "answer"])
    n = rng.randint(1, 12)
    return {
        "click": f"click[{n}]",
        "type": f"type[{n}][Kalo]",
        "select": f"select[{n}][business]",
        "search": "search[lamp]",
        "back": "back",
        "answer": "answer[42]",
    }[kind]


def test_random_actions_score_low():
    rng = random.Random(0)
    tasks = generate_tasks(120, seed=9)
    solved, rewards = 0, []
    for task in tasks:
        env, done, info = run(task, [random_action(rng) for _ in range(task.max_steps)])
        solved += env.solved()
        rewards.append(env.reward())
    assert solved / len(tasks) < 0.1, solved
    assert sum(rewards) / len(rewards) < 0.3


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "   ",
        "click",
        "click[]",
        "click[abc]",
        "click[999]",
        "click[1",
        "type[1]",
        "select[2][nope]",
        "CLICK[1]",
        "click[1] click[2]",
        "Sure! I will click[1]",
        "answer[]",
        "fly[away]",
        "\x00\xff",
        "🙂",
        "type[999][x]",
        "select[1][economy]",
        "back",
        "search[]",
        12345,
        None,
    ],
)
def test_garbage_gets_a_clear_observation_and_never_crashes(garbage):
    task = make_task("travel", 1, seed=4)  # starts on the form, with no history: "back" is invalid too
    env = WebEnv(task)
    first = env.reset()
    obs, done, info = env.step(garbage)
    assert obs.startswith("Invalid action: ") and ACTION_HELP in obs
    assert not info["valid"] and info["error"]
    assert not done
    assert "== Flights ==" in obs  # the page is shown again, unchanged
    assert obs.split("\n", 1)[1] == first.split("\n", 1)[1]
    assert env.reward_parts()["invalid"] == pytest.approx(-0.1)


def test_invalid_penalty_floor_and_step_after_done():
    task = make_task("fact", 1, seed=3)
    env = WebEnv(task, max_steps=8)
    env.reset()
    for _ in range(8):
        obs, done, info = env.step("nonsense")
    assert done and info["reward_parts"]["invalid"] == -0.5 and info["reward_parts"]["format"] == 0.0
    obs, done, info = env.step("click[1]")
    assert done and obs == "The episode is over."


def test_answer_checker_is_exact_up_to_case_and_spaces():
    task = make_task("fact", 1, seed=11)
    right = task.goal["answer"]
    assert run(task, task.oracle_actions()[:-1] + [f"answer[  {right.upper()} ]"])[0].solved()
    env, done, info = run(task, [task.oracle_actions()[0], "answer[wrong]"])
    assert done and info["reward_parts"]["success"] == 0.0 and env.reward() == pytest.approx(0.1)


def test_partial_credit_for_constraints_partly_met():
    task = make_task("travel", 1, seed=4)
    env, done, info = run(task, booking_with_wrong_day(task))  # 4 of 5 constraints
    assert done and info["reward_parts"]["success"] == pytest.approx(4 / 5)
    assert info["constraints"]["date"] is False and info["reward_parts"]["efficiency"] == 0.0


def test_shop_buying_the_wrong_product_gets_partial_credit():
    task = make_task("shop", 1, seed=21)
    world = task.world()
    env = WebEnv(task)
    env.reset()
    env.step(task.oracle_actions()[0])  # open the department's list
    page = env._page()
    other = next(
        e
        for e in page.elements
        if e.kind == "link"
        and e.target.startswith("shop/product/")
        and int(e.target.rsplit("/", 1)[1]) != task.goal["cheapest"]
        and world.products[int(e.target.rsplit("/", 1)[1]) - 1].in_stock
    )
    env.step(f"click[{other.id}]")
    buy = env._page().find("Buy now")
    obs, done, info = env.step(f"click[{buy.id}]")
    assert done and info["constraints"] == {"category": True, "cheapest": False, "one_order": True}
    assert info["reward_parts"]["success"] == pytest.approx(2 / 3)
    assert progress(info["constraints"], env.untouched) == pytest.approx(1 / 2)  # one_order is no progress


def test_efficiency_falls_with_detours():
    task = make_task("account", 2, seed=8)
    actions = task.oracle_actions()
    detour = actions[:1] + ["back", actions[0]] + actions[1:]
    env, done, info = run(task, detour)
    assert info["solved"] and info["reward_parts"]["efficiency"] == pytest.approx(len(actions) / len(detour))


def test_account_checker_catches_side_effects():
    task = make_task("account", 1, seed=2)
    actions = task.oracle_actions()
    env = WebEnv(task)
    env.reset()
    page = env._page()
    name_field = page.find("Display name")
    key = next(iter(task.goal))
    if key == "display_name":
        name_field = page.find("Email")
    env.step(f"type[{name_field.id}][Someone Else]")
    for a in actions:
        obs, done, info = env.step(a)
    assert done and info["constraints"][key] and not info["constraints"]["others_unchanged"]
    assert not info["solved"]


def test_fuzzed_actions_never_crash_any_page():
    """Random strings built from the action syntax's own pieces, on every family and level."""
    rng = random.Random(1)
    pieces = [
        "click",
        "type",
        "select",
        "search",
        "answer",
        "back",
        "[",
        "]",
        "1",
        "2",
        "3",
        "7",
        "12",
        " ",
        "\n",
        "economy",
        "Monday",
        "x",
        "[]",
        "][",
        "-1",
        "0",
        "99999999999999999999",
    ]
    for task in generate_tasks(48, seed=13):
        env = WebEnv(task)
        env.reset()
        for _ in range(task.max_steps):
            action = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
            obs, done, info = env.step(action)
            assert isinstance(obs, str) and obs and isinstance(info["valid"], bool)
            if done:
                assert set(info["reward_parts"]) == {"success", "format", "efficiency", "invalid"}
                break
        assert -0.5 <= env.reward() <= 1.3


def test_the_placeholders_are_invalid_and_answering_at_once_earns_no_format():
    """`answer[text]` copied from the action list is invalid, so it earns no format reward on the first
    page."""
    task = make_task("fact", 1, seed=0)
    for placeholder in ("answer[text]", "answer[ Text ]", "search[query]"):
        env = WebEnv(task)
        env.reset()
        obs, done, info = env.step(placeholder)
        assert not done and not info["valid"] and "placeholder" in obs, (placeholder, obs)
        assert env.reward_parts()["format"] == 0.0 and env.reward_parts()["invalid"] == pytest.approx(-0.1)
    # a real answer given at once is an answer, but no format is paid for it ...
    env, done, info = run(task, ["answer[Nowhere]"])
    assert done and info["reward_parts"]["format"] == 0.0 and env.reward() == 0.0
    # ... while an episode that acted on the page first is paid for its well-formed turns
    env, done, info = run(task, [task.oracle_actions()[0], "answer[Nowhere]"])
    assert done and info["reward_parts"]["format"] == 1.0 and env.reward() == pytest.approx(0.1)


def test_no_episode_that_answers_at_once_outscores_one_that_acted_first():
    """Over every family and level: answering at once (the placeholder until the step limit, or a
    wrong answer) earns less than any episode that took the scripted first step, then answered wrong."""
    at_once, acted = [], []
    for task in generate_tasks(120, seed=11):
        at_once.append(run(task, ["answer[text]"] * task.max_steps)[0].reward())
        at_once.append(run(task, ["answer[no such thing]"])[0].reward())
        env, _, _ = run(task, [task.oracle_actions()[0], "answer[no such thing]"])
        if env.state.answer is not None:  # (a first step that is the task's final act ends it unanswered)
            acted.append(env.reward())
    assert max(at_once) < min(acted), (max(at_once), min(acted))


def test_progress_pays_only_what_an_untouched_episode_would_not_have():
    """Hand-worked: (episode, partial success, progress success) for the pays an unsolved episode gets."""
    account = make_task("account", 1, seed=0)  # set the language to French, then save
    travel = make_task("travel", 1, seed=0)  # Zelmi -> Quiri, Thursday, economy (the form's default), 3
    cases = [
        (account, ["click[5]"], 1 / 2, 0.0),  # saved at once: only "others_unchanged" met
        # The right language, and the email changed too: a guard broke.
        (account, ["select[4][French]", "type[2][x@mail.example]", "click[5]"], 1 / 2, 0.0),
        (account, account.oracle_actions(), 1.0, 1.0),
        # One city typed into both fields: the class is the form's default, no progress; 3 of the other 4.
        (
            travel,
            ["type[1][Zelmi]", "type[2][Zelmi]", "select[3][Thursday]", "select[5][3]", "click[6]"],
            4 / 5,
            3 / 4,
        ),
        # Cities and day right, the party left at 1, the class changed from its default: 3 of 4, less 1.
        (
            travel,
            ["type[1][Zelmi]", "type[2][Quiri]", "select[3][Thursday]", "select[4][business]", "click[6]"],
            3 / 5,
            1 / 2,
        ),
    ]
    for task, actions, partial_pays, progress_pays in cases:
        pays = {"partial": partial_pays, "progress": progress_pays, "solved": float(partial_pays == 1)}
        for pay, expected in pays.items():
            _, done, info = run(task, actions, env=WebEnv(task, pay=pay))
            assert done and info["reward_parts"]["success"] == pytest.approx(expected), (actions, pay)


def test_web_reward_values_are_the_environments():
    from mlx_grpo.config_checks import WEB_REWARDS
    from rewards.web_browsing.env import PAYS

    assert WEB_REWARDS == PAYS
    with pytest.raises(ValueError, match="pay must be one of"):
        WebEnv(make_task("fact", 1, seed=0), pay="half")


@pytest.mark.parametrize(
    "web_reward, wrong_day_success", [("partial", 4 / 5), ("solved", 0.0), ("progress", 3 / 4)]
)
def test_web_reward_setting_decides_what_a_wrong_booking_pays(web_reward, wrong_day_success):
    """The run's `web_reward` reaches each episode's environment: an unsolved booking pays its
    constraints' fraction, nothing, or its progress (the class is the form's default: no progress);
    a solved one pays 1 every way."""
    from mlx_grpo.config import build_config
    from mlx_grpo.run.task_setup import load_task

    config = build_config({"task": "web", "model": None, "web_kinds": ["travel/1"], "web_reward": web_reward})
    task = load_task(config)
    row = next(
        r
        for r in task.train_rows
        if (goal := make_task(r["family"], r["difficulty"], r["seed"]).goal)["class"] == "economy"
        and goal["date"] != "Monday"
        and goal["passengers"] != "1"
    )
    web_task = make_task(row["family"], row["difficulty"], row["seed"])
    _, _, info = run(web_task, web_task.oracle_actions(), env=task.make_env(row))
    assert info["solved"] and info["reward_parts"]["success"] == 1.0

    _, _, info = run(web_task, booking_with_wrong_day(web_task), env=task.make_env(row))
    assert not info["solved"] and info["reward_parts"]["success"] == pytest.approx(wrong_day_success)
