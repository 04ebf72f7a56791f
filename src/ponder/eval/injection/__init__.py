"""A prompt-injection suite in AgentDojo's mould: user tasks in a small real tool world,
injection goals riding in tool output, and utility / attack success per defence layer.
`ponder bench-injection` runs it (see docs/results/safety.md)."""
