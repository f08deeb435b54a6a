python3 -m amp_backends.bench --zoo --models bert,mobilenet_v3,two_heads,gpt2,lstm,efficientnet --reps 3 --steps 16 --out /tmp/r/zoo --configs baseline,auto
