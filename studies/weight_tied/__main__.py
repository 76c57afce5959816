"""`python studies/weight_tied [--quick] [--out DIR] [--workers N]`: run the weight-tied study;
`python studies/weight_tied calibrate [--quick] [--out DIR]`: calibrate its criteria;
`python studies/weight_tied calibrate-feedback [--quick] [--out DIR]`: calibrate
linear_response on loops whose scores respond to the attention;
`python studies/weight_tied pilot [options]`: train one model and print its preconditions;
`python studies/weight_tied timescales [pilot options]`: whose modes the slow attention
modes of cached carried-attention models are (the stream's or the attention state's);
`python studies/weight_tied divergence [pilot options]`: where the training those options
ran diverged, and whether its RK4 substeps were stable there;
`python studies/weight_tied integration [pilot options]`: how far cached Fisher loops'
attention is from finer substeps of the same dynamics."""

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# Run as a folder, Python puts this folder first on sys.path, where its modules would shadow
# top-level ones of the same name; they are imported as the package `weight_tied` from the
# folder of the other studies instead (which also holds `_common`).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

if sys.argv[1:2] == ["calibrate"]:
    from weight_tied.calibration import main  # noqa: E402

    main(sys.argv[2:])
elif sys.argv[1:2] == ["calibrate-feedback"]:
    from weight_tied.calibration_feedback import main  # noqa: E402

    main(sys.argv[2:])
elif sys.argv[1:2] == ["pilot"]:
    from weight_tied.pilot import main  # noqa: E402

    main(sys.argv[2:])
elif sys.argv[1:2] == ["divergence"]:
    from weight_tied.integration import main  # noqa: E402

    main(sys.argv[2:])
elif sys.argv[1:2] == ["integration"]:
    from weight_tied.integration import main_integration  # noqa: E402

    main_integration(sys.argv[2:])
elif sys.argv[1:2] == ["timescales"]:
    from weight_tied.timescales import main  # noqa: E402

    main(sys.argv[2:])
else:
    from weight_tied.study import main  # noqa: E402

    main()
