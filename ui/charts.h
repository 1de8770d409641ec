#pragma once
// Chart widgets over Qt Charts: line charts that grow as points arrive (axes follow the
// data), and a per-tier memory chart stacked by what holds the memory. Series colours are
// fixed (so two runs compare the same way everywhere); everything else follows the palette.
#include <QChartView>
#include <QHash>
#include <QList>
#include <QPointF>
#include <QString>

class QLineSeries;
class QValueAxis;
class QLogValueAxis;
class QAreaSeries;

namespace tessera::ui {

struct MemorySample;

// Colours picked for contrast on both light and dark backgrounds.
QColor series_color(int index);

// Applies the widget palette to a chart (background, text, grid).
void apply_palette(QChart* chart, const QPalette& palette);

class LineChart : public QChartView {
  Q_OBJECT
 public:
  LineChart(const QString& title, const QString& x_label, const QString& y_label,
            QWidget* parent = nullptr);
  // Adds points to the named series (created on first use, in call order).
  void append(const QString& series, const QList<QPointF>& points);
  void clear();
  int point_count(const QString& series) const;
  int series_count() const { return int(series_.size()); }
  void set_empty_text(const QString& text);  // shown in the title while there is no point

 protected:
  void changeEvent(QEvent* event) override;

 private:
  void update_title();
  QString title_, empty_text_;
  QHash<QString, QLineSeries*> series_;
  QValueAxis* x_axis_;
  QValueAxis* y_axis_;
  double x_min_ = 0, x_max_ = 0, y_min_ = 0, y_max_ = 0;
  bool has_points_ = false;
};

// One memory tier over time, stacked by category (weights, gradients, optimizer state,
// activations and other), with the tier's budget as a dashed line when reported, the machine's
// memory in use (host) and the plan's estimated peak as lines.
class MemoryChart : public QChartView {
  Q_OBJECT
 public:
  MemoryChart(const QString& tier, QWidget* parent = nullptr);
  void append(const QList<MemorySample>& samples, double t0);
  int point_count() const;
  int system_point_count() const;
  // The plan's estimated peak of this tier, drawn across the chart (0: none).
  void set_estimate(double bytes);
  double estimate() const { return estimate_bytes_; }
  void clear();

 protected:
  void changeEvent(QEvent* event) override;

 private:
  QString tier_;
  QList<QLineSeries*> uppers_;  // cumulative, one per category
  QList<QAreaSeries*> areas_;
  QLineSeries* budget_;
  QLineSeries* system_;
  QLineSeries* estimate_;
  QValueAxis* x_axis_;
  QValueAxis* y_axis_;
  double x_max_ = 0, y_max_ = 0;
  double estimate_bytes_ = 0;
  void draw_estimate();
  void add_line(QLineSeries* series, const QString& name, int color, Qt::PenStyle style);
};

}  // namespace tessera::ui
