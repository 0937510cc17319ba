"""Environment connectors: turn what happens after a response into next-state and outcome events.

`api` (the Connector interface, discovery via the "orl.connectors" entry points, isolation),
`outcome_events` (NextStateObserved building, payload validation), built-ins `shell`,
`pytest_runner`, `webhook` and `ingest_client` (posts observations to the server); `episode`
(the environment API for agent tracks: tasks, episodes, verdicts; discovery via the
"orl.environments" entry points) with the built-in environments `tool_env` and `terminal_env`,
which `orl rollout` (orl/rollout.py) drives against the server. The default
connector, "conversation" (the next user message), is the pipeline's turn linker; the step-wise plus
outcome reward rule is the pipeline's (rules/step_rewards.py).
"""
