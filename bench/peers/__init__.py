"""pai-storage against the persistence layers of popular agent frameworks.

Run ``python -m bench.peers --report`` (see ``__main__``). Each peer lives in its
own module and imports its framework lazily: the peers are optional
development dependencies (the ``peers`` extra), never needed by the library.
"""
