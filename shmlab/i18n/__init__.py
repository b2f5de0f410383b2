"""The Chinese edition: translation catalogs for the notebooks and labs, and the language of
the messages shmlab prints.

    python -m shmlab.i18n extract | build | check      (i18n/README.md: a translator's steps)

Mirrors: nothing in torch; gettext's workflow (``xgettext`` -> ``.po`` -> ``msgfmt``) applied
to notebook cells (``catalog``, ``build``, ``checks``, ``cells``).
"""
