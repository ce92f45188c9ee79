#!/usr/bin/env bash
# Runs a command and prints its exit status after its output ("exit=N"), so that one
# CTest regular expression can check both; always exits 0.
#   exit_status.sh PROGRAM [ARGS...]
"$@" 2>&1
echo "exit=$?"
