"""The study: the variants it compares, the ablation that trains them all (a sweep), the study's claims checked
against the runs, and the report; also the quick demo."""
