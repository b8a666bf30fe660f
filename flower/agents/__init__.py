"""Agents: what one agent is (``AgentSpec``, ``build_options``), the seed's roles, the guards
that are their walls, and the workbench they share.

May import: ``flower._errors``, ``flower.i18n``, ``flower.util``, ``claude_agent_sdk``.
Never imports the run state, the step machinery, the people or the workflow: an agent is
what runs, not where or for whom.
"""
