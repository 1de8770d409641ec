#include "ui/widgets/charts.h"

#include <QAreaSeries>
#include <QChart>
#include <QEvent>
#include <QLegend>
#include <QLegendMarker>
#include <QLineSeries>
#include <QPen>
#include <QValueAxis>
#include <algorithm>
#include <cmath>

#include "ui/models/run_data.h"

namespace tessera::ui {

QColor series_color(int index) {
  static const QColor kColors[] = {QColor(0x1f, 0x77, 0xb4), QColor(0xff, 0x7f, 0x0e),
                                   QColor(0x2c, 0xa0, 0x2c), QColor(0xd6, 0x27, 0x28),
                                   QColor(0x94, 0x67, 0xbd), QColor(0x8c, 0x56, 0x4b),
                                   QColor(0x7f, 0x7f, 0x7f), QColor(0x17, 0xbe, 0xcf)};
  return kColors[index % 8];
}

void apply_palette(QChart* chart, const QPalette& palette) {
  chart->setBackgroundBrush(palette.base());
  chart->setBackgroundPen(QPen(palette.mid().color()));
  chart->setTitleBrush(palette.text());
  chart->legend()->setLabelColor(palette.text().color());
  for (QAbstractAxis* axis : chart->axes()) {
    axis->setLabelsColor(palette.text().color());
    axis->setTitleBrush(palette.text());
    QColor grid = palette.mid().color();
    grid.setAlpha(90);
    axis->setGridLineColor(grid);
    axis->setLinePenColor(palette.mid().color());
  }
}

QString format_bytes(double bytes) {
  if (!present(bytes)) return QStringLiteral("—");
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double v = bytes;
  while (std::abs(v) >= 1024.0 && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  if (unit == 0) return QString("%1 B").arg(v, 0, 'f', 0);
  const int decimals = std::abs(v) >= 100 ? 0 : std::abs(v) >= 10 ? 1 : 2;
  return QString("%1 %2").arg(v, 0, 'f', decimals).arg(kUnits[unit]);
}

namespace {

QChart* make_chart() {
  auto* chart = new QChart;
  chart->setMargins(QMargins(4, 4, 4, 4));
  chart->legend()->setAlignment(Qt::AlignBottom);
  chart->setAnimationOptions(QChart::NoAnimation);
  return chart;
}

QValueAxis* make_axis(const QString& title) {
  auto* axis = new QValueAxis;
  axis->setTitleText(title);
  axis->setLabelFormat("%.4g");
  axis->setTickCount(5);
  return axis;
}

// Axes over optimizer steps tick on whole numbers.
constexpr char kIntegerAxis[] = "tesseraIntegerAxis";

// As many decimals as the tick spacing needs: 10.334, 10.337, 10.340 rather than "10.34" three
// times; very small or large values (learning rates) in exponent form.
QString label_format(double lo, double hi, double interval) {
  const double magnitude = std::max(std::abs(lo), std::abs(hi));
  if (!(interval > 0) || !(magnitude > 0)) return "%.4g";
  if (magnitude < 1e-3 || magnitude >= 1e6) {
    const int significant = int(std::ceil(std::log10(magnitude / interval))) + 2;
    return QString("%.%1g").arg(std::clamp(significant, 2, 10));
  }
  int decimals = std::max(0, int(std::ceil(-std::log10(interval) - 1e-9)));
  const double scaled = interval * std::pow(10.0, decimals);
  if (std::abs(scaled - std::round(scaled)) > 1e-6) ++decimals;
  return QString("%.%1f").arg(std::min(decimals, 10));
}

// Round tick values ("0, 250, 500") rather than the data's own extremes; a flat line gets a
// little room above and below.
void set_range(QValueAxis* axis, double lo, double hi) {
  if (hi <= lo) {
    const double pad = std::max(std::abs(lo) * 0.1, 1e-9);
    lo -= pad;
    hi += pad;
  }
  axis->setTickCount(5);
  axis->setRange(lo, hi);
  axis->applyNiceNumbers();
  double interval = (axis->max() - axis->min()) / std::max(1, axis->tickCount() - 1);
  if (axis->property(kIntegerAxis).toBool()) {
    interval = std::max(1.0, std::ceil(interval - 1e-9));
    const double first = std::floor(lo / interval) * interval;
    const double last = std::max(first + interval, std::ceil(hi / interval) * interval);
    axis->setRange(first, last);
    axis->setTickCount(int(std::lround((last - first) / interval)) + 1);
    axis->setLabelFormat("%.0f");
    return;
  }
  axis->setLabelFormat(label_format(axis->min(), axis->max(), interval));
}

// A range change lays the whole chart out again (axis labels are measured): grow the range
// only when the data leaves it. Nice numbers leave room, so this is rare.
void cover_range(QValueAxis* axis, double lo, double hi, bool reset) {
  if (!reset && lo >= axis->min() && hi <= axis->max()) return;
  set_range(axis, lo, hi);
}

// QXYSeries::append(QList) adds the points one at a time, and the chart recomputes its
// geometry after each: quadratic in the series length. One replace() of the whole list is
// a single update.
// Qt Charts rebuilds a series' geometry on every replace(), in time linear in its points, so
// a long run would slow every update: past kMaxShownPoints every other point is dropped (the
// database keeps them all).
constexpr qsizetype kMaxShownPoints = 1200;

void append_points(QXYSeries* series, const QList<QPointF>& points) {
  if (points.isEmpty()) return;
  QList<QPointF> all = series->points();
  all.append(points);
  while (all.size() > kMaxShownPoints) {
    QList<QPointF> halved;
    halved.reserve(all.size() / 2 + 1);
    for (qsizetype i = 0; i < all.size(); i += 2) halved.push_back(all[i]);
    if (halved.back() != all.back()) halved.push_back(all.back());  // keep the latest point
    all = std::move(halved);
  }
  series->replace(all);
}

}  // namespace

LineChart::LineChart(const QString& title, const QString& x_label, const QString& y_label,
                     QWidget* parent)
    : QChartView(make_chart(), parent), title_(title) {
  setRenderHint(QPainter::Antialiasing);
  setMinimumHeight(fontMetrics().height() * 12);
  x_axis_ = make_axis(x_label);
  x_axis_->setProperty(kIntegerAxis, true);  // every line chart here is over optimizer steps
  y_axis_ = make_axis(y_label);
  chart()->addAxis(x_axis_, Qt::AlignBottom);
  chart()->addAxis(y_axis_, Qt::AlignLeft);
  set_range(x_axis_, 0, 1);
  y_axis_->setRange(0, 1);
  apply_palette(chart(), palette());
  update_title();
}

void LineChart::set_empty_text(const QString& text) {
  empty_text_ = text;
  update_title();
}

void LineChart::update_title() {
  chart()->setTitle(!has_points_ && !empty_text_.isEmpty() ? title_ + " — " + empty_text_ : title_);
}

void LineChart::append(const QString& name, const QList<QPointF>& points) {
  QList<QPointF> finite;
  finite.reserve(points.size());
  for (const QPointF& p : points)
    if (std::isfinite(p.x()) && std::isfinite(p.y())) finite.push_back(p);
  if (finite.isEmpty()) return;
  QLineSeries* s = series_.value(name);
  if (!s) {
    s = new QLineSeries;
    s->setName(name);
    QPen pen(series_color(int(series_.size())));
    pen.setWidthF(1.5);
    s->setPen(pen);
    chart()->addSeries(s);
    s->attachAxis(x_axis_);
    s->attachAxis(y_axis_);
    series_.insert(name, s);
    chart()->legend()->setVisible(series_.size() > 1);
  }
  const bool first = !has_points_;
  for (const QPointF& p : finite) {
    if (!has_points_) {
      x_min_ = x_max_ = p.x();
      y_min_ = y_max_ = p.y();
      has_points_ = true;
      update_title();
    }
    x_min_ = std::min(x_min_, p.x());
    x_max_ = std::max(x_max_, p.x());
    y_min_ = std::min(y_min_, p.y());
    y_max_ = std::max(y_max_, p.y());
  }
  append_points(s, finite);
  // Sparse series (evaluations, short runs) show their points: one point draws no line.
  s->setPointsVisible(s->count() <= 50);
  cover_range(x_axis_, std::min(x_min_, 0.0), x_max_, first);
  cover_range(y_axis_, y_min_, y_max_, first);
}

void LineChart::clear() {
  chart()->removeAllSeries();
  series_.clear();
  has_points_ = false;
  x_axis_->setRange(0, 1);
  y_axis_->setRange(0, 1);
  update_title();
}

int LineChart::point_count(const QString& name) const {
  QLineSeries* s = series_.value(name);
  return s ? int(s->count()) : 0;
}

void LineChart::changeEvent(QEvent* event) {
  if (event->type() == QEvent::PaletteChange) apply_palette(chart(), palette());
  QChartView::changeEvent(event);
}

namespace {
const char* kCategoryLabels[] = {"weights", "gradients", "optimizer state", "activations & other"};
constexpr double kMiB = 1024.0 * 1024.0;
}  // namespace

MemoryChart::MemoryChart(const QString& tier, QWidget* parent)
    : QChartView(make_chart(), parent), tier_(tier) {
  setRenderHint(QPainter::Antialiasing);
  setMinimumHeight(fontMetrics().height() * 12);
  chart()->setTitle("Memory — " + tier);
  // Six entries do not fit in one row under a half-width chart: list them at the side.
  chart()->legend()->setAlignment(Qt::AlignRight);
  QFont small = chart()->legend()->font();
  small.setPointSizeF(small.pointSizeF() * 0.85);
  chart()->legend()->setFont(small);
  x_axis_ = make_axis("seconds");
  y_axis_ = make_axis("MiB");
  chart()->addAxis(x_axis_, Qt::AlignBottom);
  chart()->addAxis(y_axis_, Qt::AlignLeft);
  QLineSeries* lower = nullptr;
  for (int i = 0; i < 4; ++i) {
    auto* upper = new QLineSeries(this);
    auto* area = new QAreaSeries(upper, lower);
    area->setName(kCategoryLabels[i]);
    QColor c = series_color(i);
    area->setPen(QPen(c, 1));
    c.setAlpha(150);
    area->setBrush(c);
    chart()->addSeries(area);
    area->attachAxis(x_axis_);
    area->attachAxis(y_axis_);
    uppers_ << upper;
    areas_ << area;
    lower = upper;
    // Drawn and listed once the category holds something (see append()).
    area->setVisible(false);
    for (QLegendMarker* marker : chart()->legend()->markers(area)) marker->setVisible(false);
  }
  budget_ = new QLineSeries;
  add_line(budget_, tr("budget"), 5, Qt::DashLine);
  system_ = new QLineSeries;
  add_line(system_, tr("system RAM in use"), 6, Qt::DotLine);
  estimate_ = new QLineSeries;
  add_line(estimate_, tr("plan estimate"), 7, Qt::DashDotLine);
  x_axis_->setRange(0, 1);
  y_axis_->setRange(0, 1);
  apply_palette(chart(), palette());
}

void MemoryChart::add_line(QLineSeries* series, const QString& name, int color,
                           Qt::PenStyle style) {
  series->setName(name);
  series->setPen(QPen(series_color(color), 1.5, style));
  chart()->addSeries(series);
  series->attachAxis(x_axis_);
  series->attachAxis(y_axis_);
  // Listed in the legend once it has points.
  for (QLegendMarker* marker : chart()->legend()->markers(series)) marker->setVisible(false);
  connect(series, &QXYSeries::pointsReplaced, this, [this, series] {
    for (QLegendMarker* marker : chart()->legend()->markers(series))
      marker->setVisible(series->count() > 0);
  });
}

void MemoryChart::set_estimate(double bytes) {
  estimate_bytes_ = bytes > 0 ? bytes : 0;
  draw_estimate();
}

void MemoryChart::draw_estimate() {
  if (!(estimate_bytes_ > 0)) {
    estimate_->clear();
    return;
  }
  const double y = estimate_bytes_ / kMiB;
  y_max_ = std::max(y_max_, y);
  estimate_->replace(QList<QPointF>{{0, y}, {std::max(x_max_, 1.0), y}});
  cover_range(y_axis_, 0, std::max(y_max_ * 1.05, 1.0), false);
}

void MemoryChart::append(const QList<MemorySample>& samples, double t0) {
  QList<QList<QPointF>> points(4);
  QList<QPointF> budget, system;
  for (const MemorySample& m : samples) {
    if (m.tier != tier_) continue;
    const double x = m.t - t0;
    bool any = false;
    for (double v : m.by_category) any = any || present(v);
    double sum = 0;
    for (int i = 0; i < 4; ++i) {
      // Without a breakdown everything used counts as "other".
      double v = any ? (present(m.by_category[i]) ? m.by_category[i] : 0) : (i == 3 ? m.used : 0);
      if (v > 0) shown_[i] = true;
      sum += v / kMiB;
      points[i].push_back({x, sum});
    }
    x_max_ = std::max(x_max_, x);
    y_max_ = std::max(y_max_, sum);
    if (present(m.budget)) {
      budget.push_back({x, m.budget / kMiB});
      y_max_ = std::max(y_max_, m.budget / kMiB);
    }
    if (present(m.system_used)) {
      system.push_back({x, m.system_used / kMiB});
      y_max_ = std::max(y_max_, m.system_used / kMiB);
    }
  }
  if (points[0].isEmpty()) return;
  for (int i = 0; i < 4; ++i) {
    append_points(uppers_[i], points[i]);
    if (shown_[i] && !areas_[i]->isVisible()) {
      areas_[i]->setVisible(true);
      for (QLegendMarker* marker : chart()->legend()->markers(areas_[i])) marker->setVisible(true);
    }
  }
  if (!budget.isEmpty()) append_points(budget_, budget);
  if (!system.isEmpty()) append_points(system_, system);
  if (estimate_bytes_ > 0) draw_estimate();
  cover_range(x_axis_, 0, std::max(x_max_, 1.0), false);
  cover_range(y_axis_, 0, std::max(y_max_ * 1.05, 1.0), false);
}

int MemoryChart::point_count() const {
  return int(uppers_[0]->count());
}

int MemoryChart::system_point_count() const {
  return int(system_->count());
}

double MemoryChart::last_bytes(int category) const {
  const QLineSeries* upper = uppers_.value(category);
  if (!upper || upper->count() == 0) return kMissing;
  const qsizetype last = upper->count() - 1;
  const double below = category > 0 ? uppers_[category - 1]->at(last).y() : 0.0;
  return (upper->at(last).y() - below) * kMiB;
}

bool MemoryChart::category_shown(int category) const {
  const QAreaSeries* area = areas_.value(category);
  return area && area->isVisible();
}

void MemoryChart::clear() {
  for (auto* s : uppers_) s->clear();
  for (int i = 0; i < 4; ++i) {
    shown_[i] = false;
    areas_[i]->setVisible(false);
    for (QLegendMarker* marker : chart()->legend()->markers(areas_[i])) marker->setVisible(false);
  }
  budget_->clear();
  system_->clear();
  estimate_->clear();
  estimate_bytes_ = 0;
  x_max_ = y_max_ = 0;
  x_axis_->setRange(0, 1);
  y_axis_->setRange(0, 1);
}

void MemoryChart::changeEvent(QEvent* event) {
  if (event->type() == QEvent::PaletteChange) apply_palette(chart(), palette());
  QChartView::changeEvent(event);
}

TrafficChart::TrafficChart(QWidget* parent) : QChartView(make_chart(), parent) {
  setRenderHint(QPainter::Antialiasing);
  setMinimumHeight(fontMetrics().height() * 12);
  chart()->setTitle(tr("Chunk traffic"));
  QFont small = chart()->legend()->font();
  small.setPointSizeF(small.pointSizeF() * 0.85);
  chart()->legend()->setFont(small);
  x_axis_ = make_axis(tr("seconds"));
  y_axis_ = make_axis(QString());
  chart()->addAxis(x_axis_, Qt::AlignBottom);
  chart()->addAxis(y_axis_, Qt::AlignLeft);
  read_ = new QLineSeries;
  written_ = new QLineSeries;
  read_->setName(tr("disk → host"));
  written_->setName(tr("host → disk"));
  read_->setPen(QPen(series_color(0), 1.5));
  written_->setPen(QPen(series_color(1), 1.5));
  for (QLineSeries* series : {read_, written_}) {
    chart()->addSeries(series);
    series->attachAxis(x_axis_);
    series->attachAxis(y_axis_);
  }
  set_unit(1);
  x_axis_->setRange(0, 1);
  y_axis_->setRange(0, 1);
  apply_palette(chart(), palette());
}

QString TrafficChart::unit() const {
  return y_axis_->titleText();
}

void TrafficChart::set_unit(double bytes_per_unit) {
  static const char* kUnits[] = {"B/s", "KiB/s", "MiB/s", "GiB/s", "TiB/s"};
  int index = 0;
  for (double b = bytes_per_unit; b >= 1024.0 && index < 4; b /= 1024.0) ++index;
  // Points already drawn move to the new unit (a power of 1024: exact).
  const double factor = bytes_per_unit_ / bytes_per_unit;
  for (QLineSeries* series : {read_, written_}) {
    if (factor == 1.0 || series->count() == 0) continue;
    QList<QPointF> points = series->points();
    for (QPointF& p : points) p.setY(p.y() * factor);
    series->replace(points);
  }
  bytes_per_unit_ = bytes_per_unit;
  y_axis_->setTitleText(kUnits[index]);
}

void TrafficChart::append(const QList<MemorySample>& samples, double t0) {
  QList<QPointF> read, written;  // y in bytes/s until the unit is known
  for (const MemorySample& m : samples) {
    if (m.tier != "disk") continue;
    const double x = m.t - t0;
    const double in = m.traffic.read_bytes_per_s, out = m.traffic.written_bytes_per_s;
    if (present(in)) read.push_back({x, in});
    if (present(out)) written.push_back({x, out});
    if (!present(in) && !present(out)) continue;
    x_max_ = std::max(x_max_, x);
    y_max_bytes_ = std::max({y_max_bytes_, present(in) ? in : 0.0, present(out) ? out : 0.0});
  }
  if (read.isEmpty() && written.isEmpty()) return;
  double bytes_per_unit = 1;
  while (y_max_bytes_ / bytes_per_unit >= 1024.0 && bytes_per_unit < std::pow(1024.0, 4))
    bytes_per_unit *= 1024.0;
  const bool new_unit = bytes_per_unit != bytes_per_unit_;
  if (new_unit) set_unit(bytes_per_unit);
  for (QPointF& p : read) p.setY(p.y() / bytes_per_unit_);
  for (QPointF& p : written) p.setY(p.y() / bytes_per_unit_);
  append_points(read_, read);
  append_points(written_, written);
  cover_range(x_axis_, 0, std::max(x_max_, 1.0), false);
  cover_range(y_axis_, 0, std::max(y_max_bytes_ / bytes_per_unit_ * 1.05, 1.0), new_unit);
}

int TrafficChart::point_count() const {
  return int(std::max(read_->count(), written_->count()));
}

double TrafficChart::last_rate(Direction direction) const {
  const QLineSeries* series = direction == Direction::DiskToHost ? read_ : written_;
  if (series->count() == 0) return kMissing;
  return series->at(series->count() - 1).y() * bytes_per_unit_;
}

void TrafficChart::clear() {
  read_->clear();
  written_->clear();
  set_unit(1);
  x_max_ = y_max_bytes_ = 0;
  x_axis_->setRange(0, 1);
  y_axis_->setRange(0, 1);
}

void TrafficChart::changeEvent(QEvent* event) {
  if (event->type() == QEvent::PaletteChange) apply_palette(chart(), palette());
  QChartView::changeEvent(event);
}

}  // namespace tessera::ui
