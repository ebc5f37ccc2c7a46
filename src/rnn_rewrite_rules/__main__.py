"""``python -m rnn_rewrite_rules``: the ``rnn-rewrite`` command."""

import sys

from rnn_rewrite_rules.cli import main

if __name__ == "__main__":
    sys.exit(main())
