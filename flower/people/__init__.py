"""People: what talks to a person — the human channel (questions, the inbox) and the
credentials a person gives flower.

May import: ``flower.agents`` (a channel mounts its tools on a spec), ``flower.state`` (the
records it reads), ``flower._errors``, ``flower.i18n``, ``flower.util``.
Never imports the step machinery or the workflow.
"""
