// Hand-drawn SVG charts: see cli/svg.hpp.
#include "cli/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace flashjit::cli::svg {
namespace {

std::string fmt(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

// The smallest of 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10 x 10^k at or above `value`.
double nice_ceiling(double value) {
  if (!(value > 0)) return 1.0;
  const double magnitude = std::pow(10.0, std::floor(std::log10(value)));
  for (double step : {1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0}) {
    if (step * magnitude >= value) return step * magnitude;
  }
  return 10 * magnitude;
}

std::string tick_label(double value) {
  if (value >= 1024 && std::fmod(value, 1024) == 0) return fmt("%.0fk", value / 1024);
  return fmt(value >= 100 || value == std::floor(value) ? "%.0f" : "%.2g", value);
}

}  // namespace

std::string escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string bar_chart(const std::vector<Bar>& bars, std::string_view unit) {
  const int label_w = 190, bar_w = 420, value_w = 190, row_h = 18, top = 8;
  const int width = label_w + bar_w + value_w;
  const int height = top * 2 + row_h * static_cast<int>(std::max<size_t>(bars.size(), 1));
  double top_value = 0;
  for (const Bar& bar : bars) top_value = std::max(top_value, bar.value);
  const double scale = top_value > 0 ? bar_w / top_value : 0;
  std::string out = "<svg class=\"bars\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    std::to_string(width) + "\" height=\"" + std::to_string(height) +
                    "\" viewBox=\"0 0 " + std::to_string(width) + " " + std::to_string(height) +
                    "\" font-family=\"sans-serif\" font-size=\"11\">\n" +
                    "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  int y = top;
  for (const Bar& bar : bars) {
    const double length = std::max(bar.value * scale, bar.value > 0 ? 1.0 : 0.0);
    out += "<text x=\"" + std::to_string(label_w - 6) + "\" y=\"" + std::to_string(y + 13) +
           "\" text-anchor=\"end\">" + escape(bar.label) + "</text>\n";
    out += "<rect class=\"bar\" x=\"" + std::to_string(label_w) + "\" y=\"" +
           std::to_string(y + 2) + "\" width=\"" + fmt("%.1f", length) + "\" height=\"" +
           std::to_string(row_h - 4) + "\" fill=\"" + bar.color + "\"/>\n";
    std::string value = fmt("%.3g ", bar.value);
    value += unit;
    if (!bar.note.empty()) value += " (" + bar.note + ")";
    out += "<text x=\"" + fmt("%.1f", label_w + length + 4) + "\" y=\"" + std::to_string(y + 13) +
           "\">" + escape(value) + "</text>\n";
    y += row_h;
  }
  out += "</svg>\n";
  return out;
}

std::string line_panels(std::string_view title, const std::vector<Panel>& panels, int columns,
                        std::string_view x_label, std::string_view y_label) {
  std::set<double> xs;
  double y_top = 0;
  std::vector<std::pair<std::string, std::string>> legend;  // name, color (first seen order)
  for (const Panel& panel : panels) {
    for (const Series& series : panel.series) {
      if (std::none_of(legend.begin(), legend.end(),
                       [&](const auto& entry) { return entry.first == series.name; })) {
        legend.emplace_back(series.name, series.color);
      }
      for (const auto& [x, y] : series.points) {
        if (x > 0) xs.insert(x);
        y_top = std::max(y_top, y);
      }
    }
  }
  y_top = nice_ceiling(y_top * 1.05);
  double x_lo = xs.empty() ? 0 : std::log2(*xs.begin());
  double x_hi = xs.empty() ? 1 : std::log2(*xs.rbegin());
  if (x_hi == x_lo) x_lo -= 1, x_hi += 1;
  columns =
      std::max(1, std::min<int>(columns, static_cast<int>(std::max<size_t>(panels.size(), 1))));
  const int rows = (static_cast<int>(panels.size()) + columns - 1) / columns;
  const int panel_w = 300, panel_h = 200, margin_l = 60, margin_t = 80, gap_x = 50, gap_y = 70;
  const int width = margin_l + columns * (panel_w + gap_x);
  const int height = margin_t + std::max(rows, 1) * (panel_h + gap_y);

  std::string out = "<svg class=\"lines\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    std::to_string(width) + "\" height=\"" + std::to_string(height) +
                    "\" viewBox=\"0 0 " + std::to_string(width) + " " + std::to_string(height) +
                    "\" font-family=\"sans-serif\" font-size=\"11\">\n" +
                    "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out += "<text x=\"" + std::to_string(margin_l) + "\" y=\"22\" font-size=\"15\" " +
         "font-weight=\"bold\">" + escape(title) + "</text>\n";
  int lx = margin_l;
  for (const auto& [name, color] : legend) {
    out += "<line x1=\"" + std::to_string(lx) + "\" y1=\"38\" x2=\"" + std::to_string(lx + 24) +
           "\" y2=\"38\" stroke=\"" + color + "\" stroke-width=\"2.5\"/>\n";
    out += "<text x=\"" + std::to_string(lx + 30) + "\" y=\"42\">" + escape(name) + "</text>\n";
    lx += 40 + 7 * static_cast<int>(name.size());
  }
  for (size_t p = 0; p < panels.size(); ++p) {
    const Panel& panel = panels[p];
    const int x0 = margin_l + static_cast<int>(p % columns) * (panel_w + gap_x);
    const int y0 = margin_t + static_cast<int>(p / columns) * (panel_h + gap_y);
    auto px = [&](double x) { return x0 + (std::log2(x) - x_lo) / (x_hi - x_lo) * panel_w; };
    auto py = [&](double y) { return y0 + panel_h - y / y_top * panel_h; };
    out += "<g class=\"panel\" data-title=\"" + escape(panel.title) + "\">\n";
    out += "<text x=\"" + fmt("%.1f", x0 + panel_w / 2.0) + "\" y=\"" + std::to_string(y0 - 8) +
           "\" font-size=\"13\" text-anchor=\"middle\">" + escape(panel.title) + "</text>\n";
    out += "<rect x=\"" + std::to_string(x0) + "\" y=\"" + std::to_string(y0) + "\" width=\"" +
           std::to_string(panel_w) + "\" height=\"" + std::to_string(panel_h) +
           "\" fill=\"none\" stroke=\"#444\"/>\n";
    for (int k = 0; k <= 5; ++k) {
      const double v = y_top * k / 5;
      out += "<line x1=\"" + std::to_string(x0) + "\" y1=\"" + fmt("%.1f", py(v)) + "\" x2=\"" +
             std::to_string(x0 + panel_w) + "\" y2=\"" + fmt("%.1f", py(v)) +
             "\" stroke=\"#ddd\"/>\n";
      out += "<text x=\"" + std::to_string(x0 - 4) + "\" y=\"" + fmt("%.1f", py(v) + 4) +
             "\" text-anchor=\"end\">" + tick_label(v) + "</text>\n";
    }
    for (double x : xs) {
      out += "<text x=\"" + fmt("%.1f", px(x)) + "\" y=\"" + std::to_string(y0 + panel_h + 14) +
             "\" text-anchor=\"middle\">" + tick_label(x) + "</text>\n";
    }
    out += "<text x=\"" + fmt("%.1f", x0 + panel_w / 2.0) + "\" y=\"" +
           std::to_string(y0 + panel_h + 30) + "\" text-anchor=\"middle\">" + escape(x_label) +
           "</text>\n";
    if (p % columns == 0) {
      const std::string cy = fmt("%.1f", y0 + panel_h / 2.0);
      out += "<text x=\"" + std::to_string(x0 - 42) + "\" y=\"" + cy +
             "\" text-anchor=\"middle\" transform=\"rotate(-90 " + std::to_string(x0 - 42) + " " +
             cy + ")\">" + escape(y_label) + "</text>\n";
    }
    for (const Series& series : panel.series) {
      std::vector<std::pair<double, double>> points = series.points;
      std::sort(points.begin(), points.end());
      std::string coords;
      for (const auto& [x, y] : points) {
        if (!(x > 0)) continue;
        if (!coords.empty()) coords += " ";
        coords += fmt("%.1f", px(x));
        coords += ",";
        coords += fmt("%.1f", py(y));
      }
      if (coords.empty()) continue;
      out += "<polyline class=\"series\" data-series=\"" + escape(series.name) +
             "\" fill=\"none\" stroke=\"" + series.color + "\" stroke-width=\"2\" points=\"" +
             coords + "\"/>\n";
      for (const auto& [x, y] : points) {
        if (x > 0) {
          out += "<circle cx=\"" + fmt("%.1f", px(x)) + "\" cy=\"" + fmt("%.1f", py(y)) +
                 "\" r=\"2.5\" fill=\"" + series.color + "\"/>\n";
        }
      }
    }
    out += "</g>\n";
  }
  out += "</svg>\n";
  return out;
}

}  // namespace flashjit::cli::svg
