/** Small time-series charts (uPlot, drawn on a canvas): one per series set, resized with their box. */
import { h } from "./dom.js";
import uPlot from "./uplot.js";

export interface SeriesSpec {
  label: string;
  color: string;
  /** Values as shown in the legend and tooltip. */
  format?: (v: number) => string;
}

const AXIS = { stroke: "#8a8f98", grid: { stroke: "rgba(138, 143, 152, 0.2)" }, ticks: { stroke: "rgba(138, 143, 152, 0.3)" } };
const HEIGHT = 170;

export class TimeChart {
  readonly el: HTMLElement;
  private plot?: uPlot;
  private readonly resize = new ResizeObserver(() => this.plot?.setSize({ width: this.width(), height: HEIGHT }));

  constructor(
    private readonly title: string,
    private readonly series: SeriesSpec[],
    private readonly style: "lines" | "bars" = "lines",
  ) {
    this.el = h("figure", { class: "chart", "aria-label": title }, h("figcaption", {}, title));
    this.resize.observe(this.el);
  }

  /** `x`: unix seconds; one array of values per series (null: no value there, drawn as a gap). */
  update(x: number[], ys: (number | null)[][]): void {
    const data: uPlot.AlignedData = [x, ...ys];
    if (this.plot) return this.plot.setData(data);
    const bars = this.style === "bars" ? uPlot.paths.bars!({ size: [0.8, 12] }) : undefined;
    this.plot = new uPlot(
      {
        width: this.width(),
        height: HEIGHT,
        cursor: { drag: { x: false, y: false } },
        legend: { live: true },
        scales: { y: { range: (_u, _min, max) => [0, Math.max(1, max * 1.1)] } },
        axes: [AXIS, { ...AXIS, size: 48 }],
        series: [
          {},
          ...this.series.map((s) => ({
            label: s.label,
            stroke: s.color,
            fill: this.style === "bars" ? s.color : undefined,
            width: this.style === "bars" ? 0 : 1.5,
            paths: bars,
            points: { show: false },
            value: (_u: uPlot, v: number | null) => (v === null ? "–" : s.format ? s.format(v) : String(v)),
          })),
        ],
      },
      data,
      this.el,
    );
  }

  destroy(): void {
    this.resize.disconnect();
    this.plot?.destroy();
  }

  private width(): number {
    return Math.max(240, this.el.clientWidth - 4);
  }
}
