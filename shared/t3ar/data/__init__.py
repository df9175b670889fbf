"""Dataset readers: image folders, archives (safe extraction), CSV manifests, a target folder with its
labels.csv; image decoding; subsampling."""
