"""The commands that are more than one library call (eval, collect, judge, simsft,
warmup-data, show, Dr. Zero's propose and loop): each reads its inputs, calls the library,
validates and writes its outputs. ``cli.py`` only turns flags into their options.
(The top-level ``stages/`` folder holds shell recipes that chain these commands.)"""
