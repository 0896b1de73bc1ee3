"""Makes docs/images/rerun-demo.png: the demo's groups in the Rerun viewer, rendered by
the viewer itself, headless, on a software rasterizer (no display, no GPU).

    apt-get install mesa-vulkan-drivers      # lavapipe: Vulkan on the CPU
    videoflow demo --clock-offset cam2:0.020 --clock-correction running \\
        --rerun /tmp/demo.rrd
    python docs/rerun_screenshot.py /tmp/demo.rrd docs/images/rerun-demo.png
"""

from __future__ import annotations

import sys
import time

from rerun.experimental import ViewerClient


def main(recording: str, picture: str) -> None:
    viewer = ViewerClient.spawn(headless=True, port=9877, hide_welcome_screen=True)
    try:
        viewer.open(recording)
        time.sleep(5)  # open answers before the file is loaded and drawn
        viewer.save_screenshot(picture)
    finally:
        viewer.quit()


if __name__ == "__main__":
    main(*sys.argv[1:3])
