// Hand-drawn SVG charts for `flashjit report` (plain SVG 1.1 text, inline in one HTML file, no
// network, no scripts): a horizontal bar chart (a problem's configs by speed) and panels of
// lines over a log2 axis (speed vs sequence length per implementation, as
// bench/side_by_side_report.py draws them for docs/PERFORMANCE.md).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashjit::cli::svg {

// Text for XML/HTML content and attribute values.
std::string escape(std::string_view text);

// The palette of bench/side_by_side_report.py (COLORS).
inline constexpr const char* kChosen = "#d62728";   // flashjit tuned / the chosen config
inline constexpr const char* kDefault = "#ff9896";  // flashjit default / the default config
inline constexpr const char* kOther = "#1f77b4";    // torch SDPA flash / any other config
inline constexpr const char* kFourth = "#2ca02c";   // cuDNN

struct Bar {
  std::string label;  // left of the bar
  double value = 0;   // bar length
  std::string color;
  std::string note;  // after the value ("chosen", "default")
};
// One bar per entry, in the given order, scaled to the largest value; `unit` follows the values.
std::string bar_chart(const std::vector<Bar>& bars, std::string_view unit);

struct Series {
  std::string name;  // legend entry and data-series attribute
  std::string color;
  std::vector<std::pair<double, double>> points;  // (x > 0, y)
};
struct Panel {
  std::string title;
  std::vector<Series> series;
};
// Panels in rows of `columns`, each with the same log2 x axis (ticks at the x values present)
// and linear y axis from 0 (shared by all panels); a legend of every series name on top.
std::string line_panels(std::string_view title, const std::vector<Panel>& panels, int columns,
                        std::string_view x_label, std::string_view y_label);

}  // namespace flashjit::cli::svg
