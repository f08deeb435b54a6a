python3 -m amp_backends.bench --zoo --models bert,two_heads --configs baseline,auto --reps 3 --steps 16 --out zoo
