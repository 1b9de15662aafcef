"""What served tau does the shipped reference drafter for SmolLM2-135M-Instruct reach (corpus at scale, SFT to the plateau)?

Command: ``python benchmarks/reference_drafter/run.py collect | sft | report | ship`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/reference_corpus_smollm2_cpu.json, reference_drafter_smollm2_cpu.json (+ .png)``.
Runtime: hours (collect and sft resume; training_record.json of the shipped drafter lists the legs).
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
