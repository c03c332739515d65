"""``autotune profile``: the layer times of a study's layouts measured on the real stack.

==================  ================================================================
module              owns
==================  ================================================================
``layers.py``       measure the layer shapes of a study's layouts (trials of the trainer)
``command.py``      the command end to end: measure, fit, write the profile file
==================  ================================================================
"""
