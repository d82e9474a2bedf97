"""mcts: Monte Carlo tree search over reasoning traces, one KV fork per child."""
