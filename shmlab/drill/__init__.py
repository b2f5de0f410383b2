"""The interview drill: a bilingual question bank, spaced repetition, a quiz widget, exports.

    from shmlab.drill import Quiz; Quiz()          # in a notebook (notebooks/10_interview_drill)
    python -m shmlab.drill                         # in a terminal, a few cards a session
    python -m shmlab.drill --export anki drill.apkg  (or --export csv drill.csv)

bank.json holds the cards (bank.schema.json their shape); schedule.py the Leitner boxes;
state.py where your progress is saved (the user data dir, or $SHMLAB_DRILL_DIR); deck.py a
session; cli.py the terminal; quiz.py the widget; export.py CSV and Anki; notebooks.py and
sync.py keep the notebooks' follow-up sections and the bank in step.
"""

from .bank import Card, load
from .deck import Deck
from .schedule import GRADES, Scheduler

__all__ = ["GRADES", "Card", "Deck", "Quiz", "Scheduler", "load"]


def __getattr__(name):
    if name == "Quiz":  # imported on first use: the terminal mode does not need ipywidgets
        from .quiz import Quiz

        return Quiz
    raise AttributeError(name)
