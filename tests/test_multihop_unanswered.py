"""A multihop episode cut before it answered: its looking-up still counts in support_reward."""

from rewards.multihop import make_row
from rewards.multihop.answers import exact_match_reward, f1_reward, support_reward
from rewards.multihop.training import MultihopEnv


def test_an_episode_that_ran_out_of_turns_is_scored_on_what_it_read(tiny_model_path):
    from mlx_grpo.models.loading import load_policy

    _, tokenizer = load_policy(str(tiny_model_path))
    row = make_row("e/0", 2)
    env = MultihopEnv(row, [exact_match_reward, f1_reward, support_reward], [1.0, 0.0, 0.5], None, 5.0)
    env.bind(tokenizer)
    env.reset()
    start = row["paragraphs"][row["question_decomposition"][0]["paragraph_support_idx"]]["title"]
    _, done, info = env.step(
        f'<tool_call>{{"name": "read", "arguments": {{"title": "{start}"}}}}</tool_call>'
    )
    assert not done and info["tools/support_recall"] == 0.5  # then the rollout stops it: max_turns
    assert env.reward_parts() == {"exact_match_reward": 0.0, "f1_reward": 0.0, "support_reward": 0.5}
    assert env.reward() == 0.25 and env.answer is None and not env.info()["solved"]
    env.reset()  # nothing read, nothing answered: 0, and the default weights (1, 0, 0) give 0 either way
    assert env.reward() == 0.0 and env.reward_parts()["support_reward"] == 0.0
