#!/bin/sh
# Mutation testing of one module with its own tests (see tools/mutation.py); nice, since the machine is shared.
exec nice -n 10 python "$(dirname "$0")/mutation.py" "$@"
