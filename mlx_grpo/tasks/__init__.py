"""Tasks: where prompts come from (data), how completions are scored (rewarding), which
prompts to train on (curriculum), and what happens to rewards before advantages (shaping).
The domains themselves (arith, GSM8K, OCaml, web) live in the top-level `rewards` package."""
