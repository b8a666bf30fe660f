"""The servers flower can start for a person: a throwaway PostgreSQL (:mod:`.postgres`) and
the Temporal dev server (:mod:`.temporal`) that ``flower-super cluster up`` runs, the one
way flower reaches any Temporal service (:mod:`.temporal_client`: ``temporalio.envconfig``'s
settings, the front door's check, one line per failure), and the
scripted model server (:mod:`.model_server`, with the CLI's environment for it,
:mod:`.cli_env`) behind ``flower-super demo`` and ``flower-super model-server``. Product
code: the test kit (:mod:`flower.testing`) and the tests use it, never the reverse.

May import: ``flower._errors``, ``flower.i18n``, the standard library, ``psutil``, and the
``temporalio``/``psycopg`` drivers where a server is asked about itself.
"""
