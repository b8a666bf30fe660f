"""The step machinery: ``Runtime.run`` runs one step to its result through the step loop
(:mod:`.loop`), above a placement that runs each attempt somewhere (:mod:`.placement`: in
this process, a forked child, a cluster worker); one attempt is one SDK session
(:mod:`.attempt`).

May import: ``flower.state`` (only through the seam for what a run persists),
``flower.agents``, ``flower.people``, ``flower.docs``, ``flower._errors``, ``flower.i18n``,
``flower.util``. Never imports the workflow: a Workflow calls the Runtime, not the other way.
"""
