"""Run state: everything a run persists, behind one seam (:mod:`.seam`), two backends.

May import: ``flower._errors``, ``flower.i18n``, ``flower.util``, ``claude_agent_sdk`` types.
Never imports the step machinery, the agents, the people or the workflow.
"""
