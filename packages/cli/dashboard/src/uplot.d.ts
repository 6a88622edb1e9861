// The page imports uPlot as "./uplot.js", which the server serves from the uplot package
// (dist/uPlot.esm.js); its types are the package's.
import uPlot from "uplot";
export default uPlot;
