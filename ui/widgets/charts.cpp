#include "ui/widgets/charts.h"

#include <QAreaSeries>
#include <QBoxLayout>
#include <QCategoryAxis>
#include <QChart>
#include <QCheckBox>
#include <QEvent>
#include <QGraphicsLayout>
#include <QLabel>
#include <QLegend>
#include <QLineSeries>
#include <QPen>
#include <QResizeEvent>
#include <QValueAxis>
#include <algorithm>
#include <cmath>
#include <vector>

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
  chart->setBackgroundPen(Qt::NoPen);  // the ChartView's frame draws the border
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
  chart->setMargins(QMargins(2, 2, 6, 2));
  chart->layout()->setContentsMargins(0, 0, 0, 0);  // the frame is ChartView's: no inner padding
  chart->setBackgroundRoundness(0);
  chart->legend()->hide();  // ChartView draws its own, which wraps
  chart->setAnimationOptions(QChart::NoAnimation);
  return chart;
}

// QChartView raises its own minimum size to its chart's after every resize and never lowers
// it, so a chart once shown large (more ticks, longer labels) would hold the window large, and
// in a scroll area the two feed each other. ChartView sets the minimum instead, and re-ticks the
// axes for the size they get.
class PlotView final : public QChartView {
 public:
  using QChartView::QChartView;

 protected:
  // What QChartView's own resize does, less the minimum size: the chart fills the view.
  void resizeEvent(QResizeEvent* event) override {
    QGraphicsView::resizeEvent(event);
    chart()->resize(size());
    setSceneRect(chart()->geometry());
  }
};

// The tick count ChartView chose for an axis (see fit_to_size).
constexpr char kTickCount[] = "tesseraTickCount";

int wanted_ticks(const QValueAxis* axis) {
  const QVariant v = axis->property(kTickCount);
  return v.isValid() ? v.toInt() : 5;
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

// The smallest "nice" step (1, 2, 2.5 or 5 times a power of ten) at least `raw`.
double nice_step(double raw) {
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * power >= raw * (1 - 1e-9)) return m * power;
  return 10.0 * power;
}

// Round tick values ("0, 250, 500") rather than the data's own extremes, at most the tick count
// ChartView chose for the size (QValueAxis::applyNiceNumbers may add ticks, which then do not
// fit and are elided); a flat line gets a little room above and below.
void set_range(QValueAxis* axis, double lo, double hi) {
  if (hi <= lo) {
    const double pad = std::max(std::abs(lo) * 0.1, 1e-9);
    lo -= pad;
    hi += pad;
  }
  const int ticks = std::max(2, wanted_ticks(axis));
  const bool integer = axis->property(kIntegerAxis).toBool();
  double step = nice_step((hi - lo) / (ticks - 1));
  double first = 0, last = 0;
  // Rounding both ends out can need one tick more than asked: take the next step then.
  for (;; step = nice_step(step * 1.0001)) {
    if (integer) step = std::max(1.0, std::ceil(step - 1e-9));
    first = std::floor(lo / step + 1e-9) * step;
    last = std::ceil(hi / step - 1e-9) * step;
    if (std::lround((last - first) / step) + 1 <= ticks) break;
  }
  if (last <= first) last = first + step;
  axis->setRange(first, last);
  axis->setTickCount(int(std::lround((last - first) / step)) + 1);
  axis->setLabelFormat(integer ? QStringLiteral("%.0f") : label_format(first, last, step));
}

// A range change lays the whole chart out again (axis labels are measured): grow the range
// only when the data leaves it. Nice numbers leave room, so this is rare.
void cover_range(QValueAxis* axis, double lo, double hi, bool reset) {
  if (!reset && lo >= axis->min() && hi <= axis->max()) return;
  set_range(axis, lo, hi);
}

// A logarithmic axis over [lo, hi] in log10 units, labelled in the values themselves at "nice"
// values: the densest of 1, 1-3, 1-2-5, 1-1.5-2-3-5-7 and 1-1.2-1.5-2-2.5-3-4-5-6-8 per decade
// whose labels fit the tick count the size allows, plus one (every other decade when even 1 per
// decade does not); a range narrower than any of them is labelled at its two ends.
void set_log_range(QCategoryAxis* axis, double lo, double hi, int ticks) {
  if (hi - lo < 0.02) {  // a flat line: 5% either side
    lo -= 0.02;
    hi += 0.02;
  }
  const double pad = (hi - lo) * 0.04;
  lo -= pad;
  hi += pad;
  // The tick count leaves two lines a label; a log axis's labels are uneven (1-2-5), so one
  // label more than that still leaves room.
  ticks = std::max(2, ticks) + 1;
  static const std::vector<std::vector<double>> kMantissas = {
      {1}, {1, 3}, {1, 2, 5}, {1, 1.5, 2, 3, 5, 7}, {1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8}};
  QList<double> values;
  for (const std::vector<double>& mantissas : kMantissas) {
    QList<double> these;
    for (int k = int(std::floor(lo)) - 1; k <= int(std::ceil(hi)) + 1; ++k)
      for (double m : mantissas) {
        const double v = m * std::pow(10.0, k);
        if (std::log10(v) >= lo && std::log10(v) <= hi) these << v;
      }
    if (these.size() > ticks && !values.isEmpty()) break;
    values = these;
    if (values.size() > ticks) {  // decades only, and still too many: every other one
      QList<double> fewer;
      for (qsizetype i = 0; i < values.size(); i += 2) fewer << values[i];
      values = fewer;
      break;
    }
  }
  if (values.size() < 2) {
    values = {std::pow(10.0, lo + pad), std::pow(10.0, hi - pad)};
    for (double& v : values) v = QString::number(v, 'g', 3).toDouble();
    if (values[0] == values[1]) values.pop_back();
  }
  for (const QString& label : axis->categoriesLabels()) axis->remove(label);
  for (double v : values) {
    lo = std::min(lo, std::log10(v));
    hi = std::max(hi, std::log10(v));
  }
  axis->setRange(lo, hi);
  axis->setStartValue(lo);
  for (double v : values) axis->append(QString::number(v, 'g', 3), std::log10(v));
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

ChartView::ChartView(const QString& x_title, const QString& y_title, QWidget* parent)
    : QFrame(parent) {
  setFrameShape(QFrame::StyledPanel);
  setBackgroundRole(QPalette::Base);
  setAutoFillBackground(true);
  view_ = new PlotView(make_chart());
  view_->setFrameShape(QFrame::NoFrame);
  view_->setRenderHint(QPainter::Antialiasing);
  x_axis_ = make_axis(x_title);
  y_axis_ = make_axis(y_title);
  chart()->addAxis(x_axis_, Qt::AlignBottom);
  chart()->addAxis(y_axis_, Qt::AlignLeft);
  x_axis_->setRange(0, 1);
  y_axis_->setRange(0, 1);
  legend_ = new QLabel;
  legend_->setObjectName("chartLegend");
  legend_->setTextFormat(Qt::RichText);
  legend_->setWordWrap(true);
  legend_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  QFont small = legend_->font();
  small.setPointSizeF(small.pointSizeF() * 0.9);
  legend_->setFont(small);
  const int line = fontMetrics().height();
  legend_->setContentsMargins(line / 2, 0, line / 2, line / 4);
  legend_->hide();
  layout_ = new QBoxLayout(QBoxLayout::TopToBottom, this);
  layout_->setContentsMargins(1, 1, 1, 1);
  layout_->setSpacing(0);
  layout_->addWidget(view_, 1);
  layout_->addWidget(legend_);
  view_->setMinimumSize(0, 0);
  // The plot keeps room for a title, two ticks and the x labels (Qt elides labels below
  // that); the legend comes on top, and the dashboard scrolls when the window is smaller.
  view_->setMinimumHeight(line * 7);
  setMinimumWidth(fontMetrics().averageCharWidth() * 28);
  apply_palette(chart(), palette());
}

QChart* ChartView::chart() const {
  return view_->chart();
}

QString ChartView::legend_text() const {
  QStringList parts;
  for (const LegendEntry& e : legend_entries_)
    parts << (e.value.isEmpty() ? e.name : e.name + " " + e.value);
  return parts.join(" · ");
}

void ChartView::set_legend(const QList<LegendEntry>& entries) {
  legend_entries_ = entries;
  legend_->setVisible(!entries.isEmpty());
  render_legend();
  fit_to_size();  // longer figures need a wider (or taller) legend
}

void ChartView::add_control(QWidget* control) {
  if (!controls_) {
    controls_ = new QWidget;
    auto* row = new QHBoxLayout(controls_);
    const int line = fontMetrics().height();
    row->setContentsMargins(line / 2, line / 8, line / 2, 0);
    row->addStretch(1);
    layout_->insertWidget(0, controls_);
  }
  controls_->layout()->addWidget(control);
  fit_to_size();
}

void ChartView::render_legend() {
  // Each entry is kept whole (non-breaking spaces inside it); entries wrap between them.
  QStringList parts;
  const QColor base = palette().base().color();
  for (const LegendEntry& e : legend_entries_) {
    QColor color = e.color;
    QString mark = QStringLiteral("━");
    switch (e.mark) {
      case LegendEntry::Mark::Area:
        mark = QStringLiteral("■");
        break;
      case LegendEntry::Mark::Dashed:
        mark = QStringLiteral("╍");
        break;
      case LegendEntry::Mark::Faint:  // blended with the background, as the series is drawn
        color = QColor::fromRgbF(0.35 * color.redF() + 0.65 * base.redF(),
                                 0.35 * color.greenF() + 0.65 * base.greenF(),
                                 0.35 * color.blueF() + 0.65 * base.blueF());
        break;
      case LegendEntry::Mark::Line:
        break;
    }
    QString html = QString("<span style=\"color:%1\">%2</span>&nbsp;%3")
                       .arg(color.name(), mark, e.name.toHtmlEscaped().replace(' ', "&nbsp;"));
    if (!e.value.isEmpty())
      html += "&nbsp;<b>" + e.value.toHtmlEscaped().replace(' ', "&nbsp;") + "</b>";
    parts << html;
  }
  legend_->setText(parts.join(legend_is_beside_ ? QStringLiteral("<br>")
                                                : QStringLiteral("&nbsp;&nbsp;&nbsp; ")));
}

void ChartView::resizeEvent(QResizeEvent* event) {
  QFrame::resizeEvent(event);
  if (view_) fit_to_size();
}

void ChartView::fit_to_size() {
  const QFontMetrics fm = fontMetrics();
  const int line = fm.height();
  const bool beside = legend_beside_ && !legend_entries_.isEmpty() &&
                      width() >= fm.averageCharWidth() * 72 && height() >= line * 10;
  if (beside != legend_is_beside_) {
    legend_is_beside_ = beside;
    layout_->setDirection(beside ? QBoxLayout::LeftToRight : QBoxLayout::TopToBottom);
    legend_->setAlignment(beside ? Qt::AlignLeft | Qt::AlignVCenter : Qt::AlignCenter);
    render_legend();
  }
  // The chart view asks for its chart's minimum size; the legend must not be squeezed away.
  int plot_w = width(), plot_h = height();
  const bool listed = !legend_entries_.isEmpty();
  if (beside) {
    const int legend_w = std::min(legend_->sizeHint().width(), width() * 2 / 5);
    legend_->setFixedWidth(legend_w);
    legend_->setMinimumHeight(0);
    legend_->setMaximumHeight(QWIDGETSIZE_MAX);
    plot_w -= legend_w;
  } else {
    const int legend_h =
        listed ? std::max(0, legend_->heightForWidth(std::max(1, width() - 2))) : 0;
    legend_->setMinimumWidth(0);
    legend_->setMaximumWidth(QWIDGETSIZE_MAX);
    legend_->setFixedHeight(legend_h);
    plot_h -= legend_h;
  }
  if (controls_) plot_h -= controls_->sizeHint().height();
  // A short plot drops its axis titles (the chart's title names the quantity) before its ticks.
  const bool titles = plot_h >= line * 13;
  int rows = plot_h / line - 2 /* title */ - 1 /* x labels */ - (titles ? 1 : 0);
  const int y_ticks = std::clamp(rows / 2, 2, 6);
  const int label_w = fm.horizontalAdvance(QStringLiteral("0.0000e-00"));
  const int x_ticks =
      std::clamp((plot_w - label_w - (titles ? line : 0)) / (label_w * 3 / 2), 2, 7);
  for (QValueAxis* axis : {x_axis_, y_axis_})
    axis->setTitleVisible(titles && !axis->titleText().isEmpty());
  if (x_ticks == x_ticks_ && y_ticks == y_ticks_) return;
  x_ticks_ = x_ticks;
  y_ticks_ = y_ticks;
  x_axis_->setProperty(kTickCount, x_ticks);
  y_axis_->setProperty(kTickCount, y_ticks);
  update_ranges();
}

void ChartView::changeEvent(QEvent* event) {
  if (!view_) return QFrame::changeEvent(event);
  if (event->type() == QEvent::PaletteChange) {
    apply_palette(chart(), palette());
    render_legend();
  }
  if (event->type() == QEvent::FontChange) fit_to_size();
  QFrame::changeEvent(event);
}

LineChart::LineChart(const QString& title, const QString& x_label, const QString& y_label,
                     QWidget* parent)
    : ChartView(x_label, y_label, parent), title_(title) {
  x_axis_->setProperty(kIntegerAxis, true);  // every line chart here is over optimizer steps
  set_range(x_axis_, 0, 1);
  update_title();
}

void LineChart::set_empty_text(const QString& text) {
  empty_text_ = text;
  update_title();
}

void LineChart::update_title() {
  chart()->setTitle(!has_points_ && !empty_text_.isEmpty() ? title_ + " — " + empty_text_ : title_);
}

void LineChart::define_series(const QString& name, int color, bool faint) {
  styles_.insert(name, Style{color, faint});
}

QLineSeries* LineChart::series_for(const QString& name) {
  if (QLineSeries* s = series_.value(name)) return s;
  if (!styles_.contains(name)) {
    // The first colour no declared or earlier series has.
    auto taken = [this](int color) {
      return std::any_of(styles_.cbegin(), styles_.cend(),
                         [color](const Style& style) { return style.color == color; });
    };
    int color = 0;
    while (taken(color)) ++color;
    styles_.insert(name, Style{color, false});
  }
  const Style style = styles_.value(name);
  auto* s = new QLineSeries;
  s->setName(name);
  QColor color = series_color(style.color);
  if (style.faint) color.setAlphaF(0.35);
  QPen pen(color);
  pen.setWidthF(style.faint ? 1.0 : 1.6);
  s->setPen(pen);
  chart()->addSeries(s);
  s->attachAxis(x_axis_);
  if (log_)
    s->attachAxis(log_axis_);
  else
    s->attachAxis(y_axis_);
  series_.insert(name, s);
  order_ << name;
  update_legend();
  return s;
}

void LineChart::update_legend() {
  // One series needs no legend: the title says what it is.
  QList<LegendEntry> entries;
  if (order_.size() > 1)
    for (const QString& name : order_) {
      const Style style = styles_.value(name);
      entries << LegendEntry{name,
                             series_color(style.color),
                             style.faint ? LegendEntry::Mark::Faint : LegendEntry::Mark::Line,
                             {}};
    }
  set_legend(entries);
}

void LineChart::append(const QString& name, const QList<QPointF>& points) {
  QList<QPointF> finite;
  finite.reserve(points.size());
  for (const QPointF& p : points)
    if (std::isfinite(p.x()) && std::isfinite(p.y())) finite.push_back(p);
  if (finite.isEmpty()) return;
  QLineSeries* s = series_for(name);
  const bool first = !has_points_, first_y = !has_y_;
  if (log_box_) values_[name].append(finite);  // kept to draw again on a switch of scale
  extend_extents(finite);
  if (first) update_title();
  draw(s, finite);
  // Sparse series (evaluations, short runs) show their points: one point draws no line.
  s->setPointsVisible(s->count() <= 50);
  cover_range(x_axis_, std::min(x_min_, 0.0), x_max_, first);
  if (has_y_) cover_y(first_y);
}

void LineChart::extend_extents(const QList<QPointF>& values) {
  for (const QPointF& p : values) {
    if (!has_points_) x_min_ = x_max_ = p.x();
    has_points_ = true;
    x_min_ = std::min(x_min_, p.x());
    x_max_ = std::max(x_max_, p.x());
    if (log_ && p.y() <= 0) continue;
    const double y = log_ ? std::log10(p.y()) : p.y();
    if (!has_y_) y_min_ = y_max_ = y;
    has_y_ = true;
    y_min_ = std::min(y_min_, y);
    y_max_ = std::max(y_max_, y);
  }
}

void LineChart::draw(QLineSeries* series, const QList<QPointF>& values) {
  if (!log_) return append_points(series, values);
  QList<QPointF> logs;
  logs.reserve(values.size());
  for (const QPointF& p : values)
    if (p.y() > 0) logs.push_back(QPointF(p.x(), std::log10(p.y())));
  append_points(series, logs);
}

void LineChart::cover_y(bool reset) {
  if (!log_) return cover_range(y_axis_, y_min_, y_max_, reset);
  if (reset || y_min_ < log_axis_->min() || y_max_ > log_axis_->max())
    set_log_range(log_axis_, y_min_, y_max_, wanted_ticks(y_axis_));
}

void LineChart::offer_log_scale() {
  if (log_box_) return;
  log_box_ = new QCheckBox(tr("log scale"));
  log_box_->setObjectName("logScale");
  log_box_->setToolTip(
      tr("Plot the values on a logarithmic axis, so that late, small changes "
         "stay visible. Values at or below zero are left out while it is on."));
  QFont small = log_box_->font();
  small.setPointSizeF(small.pointSizeF() * 0.9);
  log_box_->setFont(small);
  connect(log_box_, &QCheckBox::toggled, this, &LineChart::set_log_scale);
  add_control(log_box_);
}

void LineChart::set_log_scale(bool on) {
  if (!log_box_) return;  // not offered: no values kept to draw again
  if (log_box_->isChecked() != on) log_box_->setChecked(on);  // calls back here
  if (on == log_) return;
  log_ = on;
  if (!log_axis_) {
    log_axis_ = new QCategoryAxis;  // untitled: the chart's title names the quantity
    log_axis_->setLabelsPosition(QCategoryAxis::AxisLabelsPositionOnValue);
    chart()->addAxis(log_axis_, Qt::AlignLeft);
    apply_palette(chart(), palette());
  }
  QAbstractAxis* from = on ? static_cast<QAbstractAxis*>(y_axis_) : log_axis_;
  QAbstractAxis* to = on ? static_cast<QAbstractAxis*>(log_axis_) : y_axis_;
  from->setVisible(false);
  to->setVisible(true);
  // Every series drawn again from its values, and the extents taken again.
  has_points_ = has_y_ = false;
  for (const QString& name : order_) {
    QLineSeries* s = series_.value(name);
    s->detachAxis(from);
    s->attachAxis(to);
    s->clear();
    extend_extents(values_.value(name));
    draw(s, values_.value(name));
  }
  update_ranges();
}

QList<QPointF> LineChart::shown_points(const QString& name) const {
  QLineSeries* s = series_.value(name);
  return s ? s->points() : QList<QPointF>{};
}

QList<std::pair<QString, double>> LineChart::log_ticks() const {
  QList<std::pair<QString, double>> ticks;
  if (log_axis_)
    for (const QString& label : log_axis_->categoriesLabels())
      ticks.push_back({label, log_axis_->endValue(label)});
  return ticks;
}

void LineChart::update_ranges() {
  if (!has_points_)
    set_range(x_axis_, 0, 1);
  else
    set_range(x_axis_, std::min(x_min_, 0.0), x_max_);
  if (log_) {
    set_log_range(log_axis_, has_y_ ? y_min_ : 0, has_y_ ? y_max_ : 1, wanted_ticks(y_axis_));
    return;
  }
  if (has_y_)
    set_range(y_axis_, y_min_, y_max_);
  else
    set_range(y_axis_, 0, 1);
}

void LineChart::clear() {
  chart()->removeAllSeries();
  series_.clear();
  values_.clear();
  order_.clear();
  has_points_ = false;
  has_y_ = false;
  x_axis_->setRange(0, 1);
  y_axis_->setRange(0, 1);
  if (log_) set_log_range(log_axis_, 0, 1, wanted_ticks(y_axis_));
  update_legend();
  update_title();
}

int LineChart::point_count(const QString& name) const {
  QLineSeries* s = series_.value(name);
  return s ? int(s->count()) : 0;
}

namespace {
const char* kCategoryLabels[] = {"weights", "gradients", "optimizer state", "activations & other"};
constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
}  // namespace

MemoryChart::MemoryChart(const QString& tier, QWidget* parent)
    : ChartView(tr("seconds"), "MiB", parent), tier_(tier) {
  set_unit(unit_bytes_);
  set_legend_beside_when_wide(true);
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
    area->setVisible(false);  // drawn and listed once the category holds something
  }
  budget_ = new QLineSeries;
  add_line(budget_, tr("budget"), 5, Qt::DashLine);
  system_ = new QLineSeries;
  add_line(system_, tr("system RAM in use"), 6, Qt::DotLine);
  estimate_ = new QLineSeries;
  add_line(estimate_, tr("plan estimate"), 7, Qt::DashDotLine);
}

void MemoryChart::add_line(QLineSeries* series, const QString& name, int color,
                           Qt::PenStyle style) {
  series->setName(name);
  series->setPen(QPen(series_color(color), 1.5, style));
  chart()->addSeries(series);
  series->attachAxis(x_axis_);
  series->attachAxis(y_axis_);
}

void MemoryChart::update_legend() {
  QList<LegendEntry> entries;
  for (int i = 0; i < 4; ++i)
    if (shown_[i])
      entries << LegendEntry{tr(kCategoryLabels[i]), series_color(i), LegendEntry::Mark::Area,
                             format_bytes(last_bytes(i))};
  auto last_value = [this](const QLineSeries* s) {
    return s->count() > 0 ? format_bytes(s->at(s->count() - 1).y() * unit_bytes_) : QString();
  };
  if (budget_->count() > 0)
    entries << LegendEntry{tr("budget"), series_color(5), LegendEntry::Mark::Dashed,
                           last_value(budget_)};
  if (system_->count() > 0)
    entries << LegendEntry{tr("system RAM in use"), series_color(6), LegendEntry::Mark::Dashed,
                           last_value(system_)};
  if (estimate_listed_)
    entries << LegendEntry{tr("plan estimate"), series_color(7), LegendEntry::Mark::Dashed,
                           estimate_bytes_ > 0 ? format_bytes(estimate_bytes_) : tr("none")};
  set_legend(entries);
}

void MemoryChart::set_estimate(double bytes) {
  estimate_bytes_ = bytes > 0 ? bytes : 0;
  if (estimate_bytes_ > 0) estimate_listed_ = true;
  draw_estimate();
  update_legend();
}

void MemoryChart::draw_estimate() {
  if (!(estimate_bytes_ > 0)) {
    estimate_->clear();
    return;
  }
  const double y = estimate_bytes_ / unit_bytes_;
  y_max_ = std::max(y_max_, y);
  estimate_->replace(QList<QPointF>{{0, y}, {std::max(x_max_, 1.0), y}});
  cover_range(y_axis_, 0, std::max(y_max_ * 1.05, 1.0), false);
}

QString MemoryChart::unit() const {
  return y_axis_->titleText();
}

void MemoryChart::set_unit(double unit_bytes) {
  // Points already drawn move to the new unit (a power of 1024: exact).
  const double factor = unit_bytes_ / unit_bytes;
  if (factor != 1.0) {
    QList<QLineSeries*> all = uppers_;
    all << budget_ << system_ << estimate_;
    for (QLineSeries* series : all) {
      QList<QPointF> points = series->points();
      for (QPointF& p : points) p.setY(p.y() * factor);
      series->replace(points);
    }
    y_max_ *= factor;
    set_range(y_axis_, 0, std::max(y_max_ * 1.05, 1.0));  // ranges only grow otherwise
  }
  unit_bytes_ = unit_bytes;
  const QString unit = unit_bytes >= kGiB ? QStringLiteral("GiB") : QStringLiteral("MiB");
  y_axis_->setTitleText(unit);
  // The axes' titles go when the plot is short: the chart's title says both units.
  chart()->setTitle(tr("Memory — %1 (%2 over seconds)").arg(tier_, unit));
}

void MemoryChart::append(const QList<MemorySample>& samples, double t0) {
  double most = 0;  // bytes
  for (const MemorySample& m : samples)
    if (m.tier == tier_)
      most = std::max({most, m.used, present(m.budget) ? m.budget : 0.0,
                       present(m.system_used) ? m.system_used : 0.0});
  if (unit_bytes_ < kGiB && most >= 10.0 * kGiB) set_unit(kGiB);
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
      sum += v / unit_bytes_;
      points[i].push_back({x, sum});
    }
    x_max_ = std::max(x_max_, x);
    y_max_ = std::max(y_max_, sum);
    if (present(m.budget)) {
      budget.push_back({x, m.budget / unit_bytes_});
      y_max_ = std::max(y_max_, m.budget / unit_bytes_);
    }
    if (present(m.system_used)) {
      system.push_back({x, m.system_used / unit_bytes_});
      y_max_ = std::max(y_max_, m.system_used / unit_bytes_);
    }
  }
  if (points[0].isEmpty()) return;
  for (int i = 0; i < 4; ++i) {
    append_points(uppers_[i], points[i]);
    if (shown_[i] && !areas_[i]->isVisible()) areas_[i]->setVisible(true);
  }
  if (!budget.isEmpty()) append_points(budget_, budget);
  if (!system.isEmpty()) append_points(system_, system);
  if (estimate_bytes_ > 0) draw_estimate();
  cover_range(x_axis_, 0, std::max(x_max_, 1.0), false);
  cover_range(y_axis_, 0, std::max(y_max_ * 1.05, 1.0), false);
  update_legend();
}

void MemoryChart::update_ranges() {
  set_range(x_axis_, 0, std::max(x_max_, 1.0));
  set_range(y_axis_, 0, std::max(y_max_ * 1.05, 1.0));
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
  return (upper->at(last).y() - below) * unit_bytes_;
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
  }
  budget_->clear();
  system_->clear();
  estimate_->clear();
  estimate_bytes_ = 0;
  estimate_listed_ = false;
  x_max_ = y_max_ = 0;
  unit_bytes_ = kMiB;
  set_unit(kMiB);
  x_axis_->setRange(0, 1);
  y_axis_->setRange(0, 1);
  update_legend();
}

TrafficChart::TrafficChart(QWidget* parent) : ChartView(tr("seconds"), QString(), parent) {
  chart()->setTitle(tr("Chunk traffic"));
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
  update_legend();
}

void TrafficChart::update_legend() {
  auto rate = [this](Direction d) {
    const double r = last_rate(d);
    return present(r) ? format_bytes(r) + "/s" : QString();
  };
  set_legend({LegendEntry{tr("disk → host"), series_color(0), LegendEntry::Mark::Line,
                          rate(Direction::DiskToHost)},
              LegendEntry{tr("host → disk"), series_color(1), LegendEntry::Mark::Line,
                          rate(Direction::HostToDisk)}});
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
  chart()->setTitle(tr("Chunk traffic (%1)").arg(kUnits[index]));
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
  update_legend();
}

void TrafficChart::update_ranges() {
  set_range(x_axis_, 0, std::max(x_max_, 1.0));
  set_range(y_axis_, 0, std::max(y_max_bytes_ / bytes_per_unit_ * 1.05, 1.0));
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
  update_legend();
}

}  // namespace tessera::ui
