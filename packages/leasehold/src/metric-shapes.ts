/**
 * prom-client's metrics and registry, by shape. prom-client is an optional peer dependency, so
 * the declarations an app compiles against must not import it: an app without it type-checks
 * with `skipLibCheck` off, and an app with it passes its own `Registry`, which fits these shapes.
 * Only the parts the library and its tooling call are named.
 */

export type LabelValues<L extends string> = Partial<Record<L, string | number>>;

/** A prom-client `Registry` (`metricsRegistry` option): what a scrape endpoint reads from it. */
export interface MetricsRegistry {
  readonly contentType: string;
  metrics(): Promise<string>;
  getSingleMetric(name: string): { get(): Promise<MetricReading<string>> } | undefined;
}

/** What a metric's `get()` reads (its current values, one per label set). */
export interface MetricReading<L extends string> {
  values: { value: number; labels: LabelValues<L>; metricName?: string }[];
}

export interface CounterChild {
  inc(value?: number): void;
}

export interface Counter<L extends string = string> {
  get(): Promise<MetricReading<L>>;
  inc(labels: LabelValues<L>, value?: number): void;
  inc(value?: number): void;
  labels(labels: LabelValues<L>): CounterChild;
  reset(): void;
}

export interface Gauge<L extends string = string> {
  get(): Promise<MetricReading<L>>;
  inc(labels: LabelValues<L>, value?: number): void;
  inc(value?: number): void;
  dec(labels: LabelValues<L>, value?: number): void;
  dec(value?: number): void;
  set(labels: LabelValues<L>, value: number): void;
  set(value: number): void;
  reset(): void;
}

export interface HistogramChild {
  observe(value: number): void;
}

export interface Histogram<L extends string = string> {
  get(): Promise<MetricReading<L>>;
  observe(labels: LabelValues<L>, value: number): void;
  observe(value: number): void;
  labels(labels: LabelValues<L>): HistogramChild;
  reset(): void;
}
