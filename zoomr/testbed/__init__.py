"""The synthetic long-trace recall testbed as one library unit (issue 7; shared/specs/TESTBED_NOTES.md).

- :mod:`zoomr.testbed.task`: problem generation (facts, queries, paragraphs, summaries) and the
  ``data.loader`` of ``data=testbed`` (:func:`~zoomr.testbed.task.sft_dataset`);
- :mod:`zoomr.testbed.vocab`: the word-level tokenizer (``model=tiny-testbed``) and a fast word encoder;
- :mod:`zoomr.testbed.curriculum`: the training stream (copy, bare recall, then traces of growing length);
- :mod:`zoomr.testbed.grading`: the fixed test set, the environment's script, exact grading, recall by
  reference distance (:data:`~zoomr.testbed.grading.BUCKETS`);
- :mod:`zoomr.testbed.teacher_forced`: teacher-forced accuracy (and ZoomR's pointer hit rate) that
  training logs on held-out traces;
- :mod:`zoomr.testbed.checkpoint`: a trained checkpoint and the data config it learned
  (:data:`~zoomr.testbed.checkpoint.DATA_FILE`).

The trainer is ``python -m train +method=sft_testbed`` (train/testbed_pretrain.py); the evaluator runs the
testbed as a task (``benchmark=testbed``, eval/testbed_task.py).
"""
